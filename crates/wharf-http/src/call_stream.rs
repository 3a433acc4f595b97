//! The messages of a call's stream, its response last: notifications as they come, then
//! the response as soon as the call ends, and nothing after it.

use tokio::sync::mpsc;

/// The messages of the call whose stream stands at `start`, from `rx` and, last, the call's
/// response (see [`Phase`]).
pub(crate) fn messages(
    start: Phase,
    rx: mpsc::Receiver<Vec<u8>>,
) -> impl futures_util::Stream<Item = Vec<u8>> + Send + 'static {
    futures_util::stream::unfold((start, rx), next_message)
}

/// What a streamed call's task gives back: its response, or nothing once cancelled. A task
/// that sent its response itself (a legacy call's) gives back nothing too: its stream ends
/// with what the call sent before its task ended.
pub(crate) type Ended = Result<Option<Result<Vec<u8>, wharf::ErrorReply>>, tokio::task::JoinError>;

/// Where a call's stream stands, with a message it already holds to send first.
pub(crate) enum Phase {
    /// The call runs: its notifications go out as they come.
    Running(
        tokio::task::JoinHandle<Option<Result<Vec<u8>, wharf::ErrorReply>>>,
        Option<Vec<u8>>,
    ),
    /// The call ended: what it sent before it ended goes out, then its response.
    Ending(Option<Vec<u8>>, Option<Vec<u8>>),
    /// The response went out.
    Done,
}

/// The next message of a call's stream. Its response goes out as soon as the call ends,
/// after the notifications the call sent before that; what is sent later (a progress
/// update still being flushed, a task the handler left running) is not: nothing follows
/// the response.
async fn next_message(
    (phase, mut rx): (Phase, mpsc::Receiver<Vec<u8>>),
) -> Option<(Vec<u8>, (Phase, mpsc::Receiver<Vec<u8>>))> {
    match phase {
        Phase::Running(task, Some(held)) => Some((held, (Phase::Running(task, None), rx))),
        Phase::Ending(last, Some(held)) => {
            // The call ended: a sender it left behind adds nothing (see below).
            rx.close();
            Some((held, (Phase::Ending(last, None), rx)))
        }
        Phase::Running(mut task, None) => tokio::select! {
            biased;
            Some(message) = rx.recv() => Some((message, (Phase::Running(task, None), rx))),
            ended = &mut task => {
                let last = last_message(ended);
                // What is buffered still goes out; a sender left behind sends no more.
                rx.close();
                match rx.try_recv() {
                    Ok(message) => Some((message, (Phase::Ending(last, None), rx))),
                    Err(_) => last.map(|last| (last, (Phase::Done, rx))),
                }
            }
        },
        Phase::Ending(last, None) => match rx.try_recv() {
            Ok(message) => Some((message, (Phase::Ending(last, None), rx))),
            Err(_) => last.map(|last| (last, (Phase::Done, rx))),
        },
        Phase::Done => None,
    }
}

/// The response message of a call that ended; `None` when it was cancelled (the stream is
/// gone) or its task failed.
pub(crate) fn last_message(ended: Ended) -> Option<Vec<u8>> {
    match ended {
        Ok(Some(response)) => Some(response.unwrap_or_else(|e| e.to_message())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt as _;
    use tokio::sync::mpsc;

    use super::{Phase, messages};

    /// The response follows the notifications sent before it and ends the stream, though a
    /// sender is still held (a progress update being flushed, a task the handler left
    /// running): it neither holds the response back nor is heard after it.
    #[tokio::test]
    async fn the_response_ends_the_stream_whoever_still_holds_a_sender() {
        let (tx, rx) = mpsc::channel(8);
        let lingering = tx.clone();
        tx.send(b"n1".to_vec()).await.unwrap();
        let task = tokio::spawn(async move {
            tx.send(b"n2".to_vec()).await.unwrap();
            Some(Ok(b"last".to_vec()))
        });
        let stream = messages(Phase::Running(task, None), rx);
        // Bounded only so that a regression fails instead of hanging.
        let all = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            stream.collect::<Vec<_>>(),
        )
        .await
        .expect("the stream ended");
        assert_eq!(all, [b"n1".to_vec(), b"n2".to_vec(), b"last".to_vec()]);
        lingering.send(b"late".to_vec()).await.ok();
    }
}
