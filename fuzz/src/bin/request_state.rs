//! Request-state opening: any string sent back as an MRTR `requestState`, with answers.
use serde_json::json;

fn main() {
    // A panic is what the fuzzer looks for; the server is not used after one.
    let target = std::panic::AssertUnwindSafe(wharf_fuzz::Target::new());
    afl::fuzz!(|data: &[u8]| {
        let state = wharf_fuzz::text(data);
        target.call(
            "tools/call",
            json!({
                "name": "test_input_required_result_request_state",
                "arguments": {},
                "requestState": state,
                "inputResponses": { "confirm": { "action": "accept", "content": { "ok": true } } }
            }),
        );
    });
}
