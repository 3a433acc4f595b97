//! Header values: the Base64 sentinel decoder on arbitrary bytes, the encoder's round trip,
//! and `Mcp-Param-*` comparison against a JSON value.
use wharf_protocol::headers::{HeaderParamType, decode_value, encode_value, param_matches};

fn main() {
    afl::fuzz!(|data: &[u8]| {
        if let Ok(decoded) = decode_value(data) {
            let again = encode_value(&decoded);
            assert_eq!(
                decode_value(again.as_bytes()).ok().as_deref(),
                Some(&*decoded)
            );
        }
        // First line: the header; the rest: the argument's JSON.
        let text = String::from_utf8_lossy(data);
        let (header, body) = text.split_once('\n').unwrap_or((&text, "null"));
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(body) {
            for kind in [
                HeaderParamType::String,
                HeaderParamType::Integer,
                HeaderParamType::Boolean,
            ] {
                let _ = param_matches(kind, header, &value);
            }
        }
    });
}
