//! The signals that ask a `wharf` process to stop, for the server and the client commands
//! alike.

use std::process::ExitCode;

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Ctrl-C (SIGINT) and SIGTERM (`timeout`, a service manager, `kill`), listened to from the
/// moment this is made: a signal that comes between two waits is not lost. Listening takes
/// the signals' default, killing the process, away; a signal no handler could be installed
/// for keeps its default.
pub(crate) struct StopSignals {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
}

impl StopSignals {
    /// Starts listening.
    pub(crate) fn listen() -> Self {
        StopSignals {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// The next signal, saying which, with the conventional exit code (128 + the signal's
    /// number); never, if neither could be listened to.
    pub(crate) async fn next(&mut self) -> (&'static str, ExitCode) {
        async fn one(signal: &mut Option<Signal>) {
            let heard = match signal {
                Some(s) => s.recv().await.is_some(),
                None => false,
            };
            if !heard {
                std::future::pending::<()>().await;
            }
        }
        let StopSignals {
            interrupt,
            terminate,
        } = self;
        tokio::select! {
            () = one(interrupt) => ("Ctrl-C", ExitCode::from(130)),
            () = one(terminate) => ("SIGTERM", ExitCode::from(143)),
        }
    }

    /// How many signals have come since, counted on a task of its own.
    pub(crate) fn counted(mut self) -> tokio::sync::watch::Receiver<u32> {
        let (count, counted) = tokio::sync::watch::channel(0);
        tokio::spawn(async move {
            loop {
                self.next().await;
                count.send_modify(|n| *n += 1);
            }
        });
        counted
    }
}
