//! Property tests of what the protocol crate reads from clients: header values (the Base64
//! sentinel) round trip, and no input makes the envelope parser or the header decoder panic.

use proptest::prelude::*;
use wharf_protocol::Envelope;
use wharf_protocol::headers::{decode_value, encode_value};

proptest! {
    /// Any string, encoded for a header, decodes back to itself; the encoded form is always
    /// a valid header value (visible ASCII, no edge spaces).
    #[test]
    fn header_values_round_trip(value in any::<String>()) {
        let encoded = encode_value(&value);
        prop_assert!(encoded.bytes().all(|b| (0x20..=0x7e).contains(&b)));
        prop_assert!(!encoded.starts_with(' ') && !encoded.ends_with(' '));
        let decoded = decode_value(encoded.as_bytes()).expect("an encoded value decodes");
        prop_assert_eq!(decoded.as_ref(), value.as_str());
    }

    /// Arbitrary header bytes are decoded or refused with a reason, never a panic.
    #[test]
    fn any_header_bytes_decode_or_are_refused(raw in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = decode_value(&raw);
        let mut sentinel = b"=?base64?".to_vec();
        sentinel.extend_from_slice(&raw);
        sentinel.extend_from_slice(b"?=");
        let _ = decode_value(&sentinel);
    }

    /// Arbitrary bytes, and arbitrary JSON, are parsed or refused with an error, never a panic.
    #[test]
    fn any_body_parses_or_is_refused(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Envelope::parse(&body, 64);
    }

    /// A request built from any method name, id and params parses back to the same method
    /// and id.
    #[test]
    fn requests_round_trip(method in "[a-z/_]{1,24}", id in any::<i64>(), key in "[a-z]{1,8}", value in any::<String>()) {
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": method, "params": { key: value }
        })
        .to_string();
        let envelope = Envelope::parse(body.as_bytes(), 64).expect("a valid request parses");
        prop_assert_eq!(envelope.method.as_deref(), Some(method.as_str()));
        prop_assert_eq!(
            envelope.id.map(|id| serde_json::to_value(id).unwrap()),
            Some(serde_json::json!(id))
        );
    }

    /// JSON nested deeper than the limit is refused however it nests.
    #[test]
    fn deep_json_is_refused(shape in proptest::collection::vec(any::<bool>(), 65..300)) {
        let open: String = shape.iter().map(|&array| if array { "[" } else { "{\"a\":" }).collect();
        let close: String = shape.iter().rev().map(|&array| if array { "]" } else { "}" }).collect();
        let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"x":{open}1{close}}}}}"#);
        prop_assert!(Envelope::parse(body.as_bytes(), 64).is_err());
    }
}
