//! URI template matching: any URI read against the server's resource templates.
use serde_json::json;

fn main() {
    // A panic is what the fuzzer looks for; the server is not used after one.
    let target = std::panic::AssertUnwindSafe(wharf_fuzz::Target::new());
    afl::fuzz!(|data: &[u8]| {
        let uri = wharf_fuzz::text(data);
        target.call("resources/read", json!({ "uri": uri }));
        target.call(
            "completion/complete",
            json!({ "ref": { "type": "ref/resource", "uri": uri }, "argument": { "name": "id", "value": "" } }),
        );
    });
}
