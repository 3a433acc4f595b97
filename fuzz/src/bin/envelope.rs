//! The JSON-RPC envelope parser on arbitrary bodies, and the single pass against it: what the
//! single pass reads, the long way must read alike (a disagreement is a crash).

use serde::Deserialize;
use serde_json::Value;
use wharf_protocol::Envelope;
use wharf_protocol::one_pass::{ParamsReader, read_request};

/// Reads every method's params as a value.
struct Values;

impl ParamsReader for Values {
    type Params = (String, Value);

    fn read<'de, D: serde::Deserializer<'de>>(
        &self,
        method: &str,
        params: D,
    ) -> Result<Self::Params, D::Error> {
        Ok((method.to_owned(), Value::deserialize(params)?))
    }
}

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let long = Envelope::parse(data, 64);
        if let Some((id, (method, params))) = read_request(data, 64, &Values) {
            let envelope = long.expect("the long way reads what the single pass read");
            assert_eq!(envelope.id, Some(id));
            assert_eq!(envelope.method.as_deref(), Some(method.as_str()));
            assert!(envelope.result.is_none() && envelope.error.is_none());
            let raw = envelope.params.expect("params").get();
            assert_eq!(serde_json::from_str::<Value>(raw).ok(), Some(params));
        }
    });
}
