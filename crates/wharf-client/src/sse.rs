//! An incremental Server-Sent Events parser: feed bytes, get the `data` of complete events.

/// Parses an SSE byte stream into event data strings; comments (keep-alives) are skipped.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Vec<String>,
}

impl SseParser {
    /// Feeds `chunk`; returns the data of every event it completes.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            if line.is_empty() {
                // An event of empty data carries no JSON-RPC message: skipped. A resumable
                // 2025-11-25 server opens each stream with one (an id, and `data:` with
                // nothing after it), to prime resumption.
                let data = self.data.join("\n");
                self.data.clear();
                if !data.is_empty() {
                    events.push(data);
                }
            } else if let Some(rest) = line.strip_prefix("data:") {
                self.data
                    .push(rest.strip_prefix(' ').unwrap_or(rest).to_owned());
            }
            // `:` comments, `event:`, `id:` and `retry:` carry nothing we need.
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_chunks_and_skips_comments() {
        let mut p = SseParser::default();
        assert!(p.feed(b": keep-alive\n\nevent: message\nda").is_empty());
        assert_eq!(
            p.feed(b"ta: {\"a\":1}\r\n\r\ndata: x\n"),
            vec!["{\"a\":1}".to_string()]
        );
        assert_eq!(p.feed(b"\n"), vec!["x".to_string()]);
    }

    #[test]
    fn an_event_of_empty_data_is_skipped() {
        let mut p = SseParser::default();
        assert!(p.feed(b"id: 1\ndata: \n\n").is_empty());
        assert!(p.feed(b"id: 2\ndata:\nretry: 100\n\n").is_empty());
        assert_eq!(p.feed(b"id: 3\ndata: {}\n\n"), vec!["{}".to_string()]);
    }
}
