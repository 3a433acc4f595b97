//! OAuth request parameters, from a query string (`/authorize`) or an
//! `application/x-www-form-urlencoded` body (`/token`, `/revoke`), read by one rule: each
//! parameter at most once, and one sent without a value as if omitted (RFC 6749 §3.1,
//! §3.2). Both endpoints apply it alike, so `scope=&scope=read` means the same to both.

use std::collections::HashSet;

use serde::de::DeserializeOwned;

/// Why parameters were not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ParamError {
    #[error("the parameters are malformed: {0}")]
    Malformed(String),
    /// A parameter named twice (RFC 8707 lets `resource` be, for several resources: the
    /// token endpoint answers that `invalid_target`).
    #[error("the parameter {0} appears more than once")]
    Repeated(String),
}

/// Reads `text` into `T`, or says what is wrong with it.
pub(crate) fn parse<T: DeserializeOwned>(text: &str) -> Result<T, ParamError> {
    let malformed = |err: &dyn std::fmt::Display| ParamError::Malformed(err.to_string());
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(text).map_err(|e| malformed(&e))?;
    let mut seen = HashSet::new();
    let mut kept = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        if value.is_empty() {
            continue;
        }
        if !seen.insert(name.clone()) {
            return Err(ParamError::Repeated(name));
        }
        kept.push((name, value));
    }
    // Encoded again so that `T` is read by serde_urlencoded's own rules (options, unknown
    // fields ignored); the text is a request's parameters, small and read once.
    let kept = serde_urlencoded::to_string(&kept).map_err(|e| malformed(&e))?;
    serde_urlencoded::from_str(&kept).map_err(|e| malformed(&e))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde::Deserialize;

    use super::parse;

    #[test]
    fn a_parameter_without_a_value_is_as_if_omitted() {
        let params: HashMap<String, String> = parse("scope=&resource=&state=s&scope=read").unwrap();
        assert_eq!(params.get("scope").map(String::as_str), Some("read"));
        assert!(!params.contains_key("resource"));
    }

    #[test]
    fn a_repeated_parameter_is_refused_by_name() {
        let twice = parse::<HashMap<String, String>>("state=a&x=1&state=b").unwrap_err();
        assert!(matches!(&twice, super::ParamError::Repeated(name) if name == "state"));
        let said = twice.to_string();
        assert!(said.contains("state appears more than once"), "{said}");
    }

    #[test]
    fn a_typed_form_reads_options_and_ignores_unknown_fields() {
        #[derive(Deserialize)]
        struct Form {
            grant_type: Option<String>,
            code: Option<String>,
        }
        let form: Form = parse("grant_type=refresh_token&code=&token_type_hint=x").unwrap();
        assert_eq!(form.grant_type.as_deref(), Some("refresh_token"));
        assert_eq!(form.code, None);
        let escaped: Form = parse("code=a%26b%3Dc+d").unwrap();
        assert_eq!(escaped.code.as_deref(), Some("a&b=c d"));
    }
}
