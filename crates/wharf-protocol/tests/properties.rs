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

/// One member of a generated message: a name and its JSON text, valid or not.
fn member() -> impl Strategy<Value = (String, String)> {
    let name = prop_oneof![
        Just("jsonrpc"),
        Just("id"),
        Just("method"),
        Just("params"),
        Just("result"),
        Just("error"),
        Just("other"),
    ];
    let value = prop_oneof![
        Just(r#""2.0""#.to_owned()),
        Just(r#""2\u002e0""#.to_owned()),
        Just("null".to_owned()),
        Just("1.5".to_owned()),
        Just("[1,2]".to_owned()),
        Just(r#"{"_meta":{"k":"v"},"name":"echo","arguments":{"a":[1,{"b":null}]}}"#.to_owned()),
        Just("{}".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-z/\\\\\"]{0,8}".prop_map(|s| serde_json::to_string(&s).unwrap()),
    ];
    (name, value).prop_map(|(n, v)| (n.to_owned(), v))
}

/// Reads every method's params as a value.
struct Values;

impl wharf_protocol::one_pass::ParamsReader for Values {
    type Params = (String, serde_json::Value);

    fn read<'de, D: serde::Deserializer<'de>>(
        &self,
        method: &str,
        params: D,
    ) -> Result<Self::Params, D::Error> {
        Ok((method.to_owned(), serde::Deserialize::deserialize(params)?))
    }
}

proptest! {
    /// The single pass reads a message only as the long way reads it: whatever it accepts,
    /// `Envelope::parse` accepts too, with the same id, method and params, and as a request.
    /// The messages are a well-formed request with members shuffled, replaced and added.
    #[test]
    fn the_single_pass_reads_only_what_the_long_way_reads(
        order in Just([0usize, 1, 2, 3]).prop_shuffle(),
        replaced in proptest::option::of((0usize..4, member())),
        added in proptest::collection::vec((0usize..5, member()), 0..3),
    ) {
        let mut members: Vec<(String, String)> = [
            ("jsonrpc", r#""2.0""#),
            ("id", "7"),
            ("method", r#""tools/call""#),
            ("params", r#"{"name":"echo","arguments":{"text":"hi"}}"#),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
        if let Some((at, member)) = replaced {
            members[at] = member;
        }
        let mut members: Vec<_> = order.iter().map(|&i| members[i].clone()).collect();
        for (at, member) in added {
            members.insert(at.min(members.len()), member);
        }
        let body = format!(
            "{{{}}}",
            members.iter().map(|(n, v)| format!("\"{n}\":{v}")).collect::<Vec<_>>().join(",")
        );
        if let Some((id, (method, params))) =
            wharf_protocol::one_pass::read_request(body.as_bytes(), 64, &Values)
        {
            let envelope = Envelope::parse(body.as_bytes(), 64).expect("the long way reads it too");
            prop_assert_eq!(envelope.id, Some(id));
            prop_assert_eq!(envelope.method.as_deref(), Some(method.as_str()));
            prop_assert!(envelope.result.is_none() && envelope.error.is_none());
            let raw = envelope.params.expect("params").get();
            let long: serde_json::Value = serde_json::from_str(raw).unwrap();
            prop_assert_eq!(long, params);
        }
    }

    /// A well-formed request is read in one pass whatever the order of its members, as long
    /// as its params follow its method.
    #[test]
    fn well_formed_requests_are_read_in_one_pass(
        id in any::<i64>(),
        method in "[a-z/]{1,12}",
        order in Just([0usize, 1, 2, 3]).prop_shuffle()
    ) {
        let members = [
            r#""jsonrpc":"2.0""#.to_owned(),
            format!(r#""id":{id}"#),
            format!(r#""method":"{method}""#),
            r#""params":{"_meta":{}}"#.to_owned(),
        ];
        let method_at = order.iter().position(|&m| m == 2).unwrap();
        let params_at = order.iter().position(|&m| m == 3).unwrap();
        let body = format!(
            "{{{}}}",
            order.iter().map(|&m| members[m].as_str()).collect::<Vec<_>>().join(",")
        );
        let read = wharf_protocol::one_pass::read_request(body.as_bytes(), 64, &Values);
        prop_assert_eq!(read.is_some(), method_at < params_at);
    }
}
