//! Cursor opening: any string sent back as a list cursor.
use serde_json::json;

fn main() {
    // A panic is what the fuzzer looks for; the server is not used after one.
    let target = std::panic::AssertUnwindSafe(wharf_fuzz::Target::new());
    afl::fuzz!(|data: &[u8]| {
        let cursor = wharf_fuzz::text(data);
        for method in [
            "tools/list",
            "prompts/list",
            "resources/list",
            "resources/templates/list",
        ] {
            target.call(method, json!({ "cursor": cursor }));
        }
    });
}
