//! The JSON-RPC envelope parser on arbitrary bodies.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        let _ = wharf_protocol::Envelope::parse(data, 64);
    });
}
