//! The signals that ask a `wharf` process to stop, for the server and the client commands
//! alike.

use std::process::ExitCode;

/// Resolves once Ctrl-C (SIGINT) or SIGTERM (`timeout`, a service manager, `kill`) comes,
/// saying which, with the conventional exit code (128 + the signal's number). Listening
/// takes the signals' default, killing the process, away from the moment this is first
/// polled; a signal no handler could be installed for keeps its default (and this never
/// resolves for it).
pub(crate) async fn stop_requested() -> (&'static str, ExitCode) {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => ("Ctrl-C", ExitCode::from(130)),
        () = term => ("SIGTERM", ExitCode::from(143)),
    }
}
