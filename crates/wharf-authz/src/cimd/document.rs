//! A fetched Client ID Metadata Document, checked as the draft and the 2026-07-28
//! client-registration page require: a JSON object whose `client_id` is the URL it was
//! fetched from, byte for byte, with `client_name` and `redirect_uris`; no shared secret of
//! any kind (the document is public, so a secret in it is no secret); `private_key_jwt` only
//! with the keys to check it.

use serde_json::{Map, Value};

use super::ClientIdUrl;
use crate::{client_name, redirect};

/// A client described by its metadata document.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientMetadata {
    /// The document's URL, which is the client's id.
    pub client_id: ClientIdUrl,
    /// The name to show the user.
    pub client_name: String,
    /// The client's home page, if given.
    pub client_uri: Option<String>,
    /// Where authorization responses may go, compared exactly.
    pub redirect_uris: Vec<String>,
    /// How the client authenticates at the token endpoint.
    pub auth: ClientAuth,
    /// The scopes the client says it may ask for, if it says.
    pub scope: Option<String>,
    /// Whether it may use refresh tokens: its `grant_types` name `refresh_token`, or it
    /// names none (RFC 7591 §2's default is `authorization_code` alone, but MCP clients
    /// that omit the field expect refresh tokens, as before).
    pub refresh: bool,
}

/// How a metadata-document client authenticates at the token endpoint.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientAuth {
    /// A public client: PKCE alone (`token_endpoint_auth_method` `none`, the default).
    None,
    /// `private_key_jwt` (RFC 7523), with the keys its assertions are checked against.
    PrivateKeyJwt(KeySource),
}

/// Where a `private_key_jwt` client's public keys are.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum KeySource {
    /// Inline, as a JWK set.
    Jwks(Value),
    /// At an `https` URL.
    JwksUri(String),
}

/// Why a fetched document is refused. Each message names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DocumentError {
    /// Not JSON, or JSON that is not an object.
    #[error("the client metadata document is not a JSON object")]
    NotObject,
    /// No `client_id`, or one that differs from the URL.
    #[error(
        "the document's client_id {found:?} is not the URL it was fetched from ({expected:?}); they must be equal, character for character"
    )]
    ClientIdMismatch {
        /// The URL fetched.
        expected: String,
        /// The document's `client_id`, or `null` when absent.
        found: String,
    },
    /// A required field missing or of the wrong type.
    #[error("the document's {field} is required and must be {expected}")]
    Required {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// An optional field of the wrong type.
    #[error("the document's {field} must be {expected}")]
    WrongType {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A redirect URI that no client may register.
    #[error("the document's {0}")]
    RedirectUri(String),
    /// A shared-secret authentication method, or a secret in the document.
    #[error(
        "the document asks for {0}, a shared secret; a client identified by a metadata document authenticates with \"none\" (PKCE) or \"private_key_jwt\""
    )]
    SharedSecret(String),
    /// An authentication method this server does not implement.
    #[error(
        "the document's token_endpoint_auth_method {0:?} is not supported: use \"none\" or \"private_key_jwt\""
    )]
    UnsupportedAuthMethod(String),
    /// `private_key_jwt` without exactly one of `jwks` and `jwks_uri`.
    #[error(
        "the document's token_endpoint_auth_method is \"private_key_jwt\", which needs exactly one of jwks (a JWK set) and jwks_uri (an https URL)"
    )]
    MissingKeys,
    /// A grant or response type other than the authorization code flow's.
    #[error(
        "the document's {field} includes {value:?}; this server supports the authorization_code and refresh_token grants and the \"code\" response type"
    )]
    UnsupportedFlow {
        /// `grant_types` or `response_types`.
        field: &'static str,
        /// The value refused.
        value: String,
    },
    /// `grant_types` without `authorization_code`.
    #[error(
        "the document's grant_types must include authorization_code, the only grant that issues a first token here"
    )]
    NoAuthorizationCode,
}

impl ClientMetadata {
    /// Checks the body fetched from `url`.
    pub fn from_document(url: &ClientIdUrl, body: &[u8]) -> Result<Self, DocumentError> {
        let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(body) else {
            return Err(DocumentError::NotObject);
        };
        match doc.get("client_id") {
            Some(Value::String(id)) if id == url.as_str() => {}
            other => {
                return Err(DocumentError::ClientIdMismatch {
                    expected: url.as_str().to_owned(),
                    found: match other {
                        Some(Value::String(id)) => id.clone(),
                        Some(other) => other.to_string(),
                        None => "null".to_owned(),
                    },
                });
            }
        }
        let client_name = match doc.get("client_name") {
            Some(Value::String(name)) if client_name::is_displayable(name) => name.clone(),
            _ => {
                return Err(DocumentError::Required {
                    field: "client_name",
                    expected: client_name::EXPECTED,
                });
            }
        };
        let redirect_uris = strings(&doc, "redirect_uris")?.ok_or(DocumentError::Required {
            field: "redirect_uris",
            expected: "a non-empty array of URIs",
        })?;
        if redirect_uris.is_empty() {
            return Err(DocumentError::Required {
                field: "redirect_uris",
                expected: "a non-empty array of URIs",
            });
        }
        for (index, uri) in redirect_uris.iter().enumerate() {
            redirect::check_document(index, uri)
                .map_err(|err| DocumentError::RedirectUri(err.to_string()))?;
        }
        for field in ["client_secret", "client_secret_expires_at"] {
            if doc.contains_key(field) {
                return Err(DocumentError::SharedSecret(field.to_owned()));
            }
        }
        let auth = auth(&doc)?;
        let grants = strings(&doc, "grant_types")?;
        if let Some(grants) = &grants {
            if let Some(other) = grants
                .iter()
                .find(|g| !matches!(g.as_str(), "authorization_code" | "refresh_token"))
            {
                return Err(DocumentError::UnsupportedFlow {
                    field: "grant_types",
                    value: other.clone(),
                });
            }
        }
        // A token is only ever first issued for a code here, as at registration.
        if grants
            .as_ref()
            .is_some_and(|g| !g.iter().any(|g| g == "authorization_code"))
        {
            return Err(DocumentError::NoAuthorizationCode);
        }
        let refresh = grants.is_none_or(|g| g.iter().any(|g| g == "refresh_token"));
        if let Some(types) = strings(&doc, "response_types")? {
            if let Some(other) = types.iter().find(|t| *t != "code") {
                return Err(DocumentError::UnsupportedFlow {
                    field: "response_types",
                    value: other.clone(),
                });
            }
        }
        Ok(Self {
            client_id: url.clone(),
            client_name,
            client_uri: string(&doc, "client_uri")?,
            redirect_uris,
            auth,
            scope: string(&doc, "scope")?,
            refresh,
        })
    }
}

fn auth(doc: &Map<String, Value>) -> Result<ClientAuth, DocumentError> {
    let method = string(doc, "token_endpoint_auth_method")?;
    match method.as_deref() {
        None | Some("none") => Ok(ClientAuth::None),
        Some("private_key_jwt") => {
            let jwks = doc.get("jwks");
            let jwks_uri = string(doc, "jwks_uri")?;
            match (jwks, jwks_uri) {
                (Some(set @ Value::Object(map)), None)
                    if map.get("keys").is_some_and(Value::is_array) =>
                {
                    Ok(ClientAuth::PrivateKeyJwt(KeySource::Jwks(set.clone())))
                }
                (None, Some(uri)) if uri.starts_with("https://") => {
                    Ok(ClientAuth::PrivateKeyJwt(KeySource::JwksUri(uri)))
                }
                _ => Err(DocumentError::MissingKeys),
            }
        }
        Some(secret @ ("client_secret_basic" | "client_secret_post" | "client_secret_jwt")) => Err(
            DocumentError::SharedSecret(format!("token_endpoint_auth_method {secret:?}")),
        ),
        Some(other) => Err(DocumentError::UnsupportedAuthMethod(other.to_owned())),
    }
}

fn string(doc: &Map<String, Value>, field: &'static str) -> Result<Option<String>, DocumentError> {
    match doc.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(DocumentError::WrongType {
            field,
            expected: "a string",
        }),
    }
}

fn strings(
    doc: &Map<String, Value>,
    field: &'static str,
) -> Result<Option<Vec<String>>, DocumentError> {
    let wrong = DocumentError::WrongType {
        field,
        expected: "an array of strings",
    };
    match doc.get(field) {
        None => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned).ok_or(wrong.clone()))
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(wrong),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const URL: &str = "https://app.example.com/oauth/client.json";

    fn parse(doc: Value) -> Result<ClientMetadata, DocumentError> {
        let url = ClientIdUrl::parse(URL).unwrap();
        ClientMetadata::from_document(&url, doc.to_string().as_bytes())
    }

    fn minimal() -> Value {
        json!({
            "client_id": URL,
            "client_name": "Example MCP Client",
            "redirect_uris": ["http://127.0.0.1:3000/callback", "https://app.example.com/cb"],
        })
    }

    fn with(field: &str, value: Value) -> Value {
        let mut doc = minimal();
        doc[field] = value;
        doc
    }

    #[test]
    fn the_specifications_example_is_accepted() {
        let client = parse(with("client_uri", json!("https://app.example.com"))).unwrap();
        assert_eq!(client.client_name, "Example MCP Client");
        assert_eq!(client.auth, ClientAuth::None);
        assert_eq!(client.redirect_uris.len(), 2);
        assert_eq!(
            client.client_uri.as_deref(),
            Some("https://app.example.com")
        );
    }

    #[test]
    fn refresh_tokens_are_for_clients_that_name_the_grant_or_none() {
        assert!(parse(minimal()).unwrap().refresh);
        let both = json!(["authorization_code", "refresh_token"]);
        assert!(parse(with("grant_types", both)).unwrap().refresh);
        let code_only = json!(["authorization_code"]);
        assert!(!parse(with("grant_types", code_only)).unwrap().refresh);
        let no_code = json!(["refresh_token"]);
        let err = parse(with("grant_types", no_code)).unwrap_err();
        assert!(err.to_string().contains("grant_types"), "{err}");
    }

    #[test]
    fn the_client_id_must_be_the_url_exactly() {
        for other in [
            json!("https://app.example.com/oauth/client.json/"),
            json!("https://APP.example.com/oauth/client.json"),
            json!("https://evil.example/oauth/client.json"),
            json!(null),
            json!(7),
        ] {
            let err = parse(with("client_id", other.clone())).unwrap_err();
            assert!(
                matches!(err, DocumentError::ClientIdMismatch { .. }),
                "{other}: {err}"
            );
        }
        let mut doc = minimal();
        doc.as_object_mut().unwrap().remove("client_id");
        assert!(matches!(
            parse(doc),
            Err(DocumentError::ClientIdMismatch { .. })
        ));
    }

    #[test]
    fn required_fields_and_types_are_named() {
        let url = ClientIdUrl::parse(URL).unwrap();
        assert_eq!(
            ClientMetadata::from_document(&url, b"[1]"),
            Err(DocumentError::NotObject)
        );
        assert_eq!(
            ClientMetadata::from_document(&url, b"<html>"),
            Err(DocumentError::NotObject)
        );
        for (field, value) in [
            ("client_name", json!("")),
            ("client_name", json!("x".repeat(201))),
            ("client_name", json!("Example from \u{202E}moc.elpmaxe")),
            ("redirect_uris", json!([])),
        ] {
            let err = parse(with(field, value)).unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
        let err = parse(with("redirect_uris", json!("https://a.example/cb"))).unwrap_err();
        assert!(
            err.to_string().contains("redirect_uris must be an array"),
            "{err}"
        );
        let err = parse(with("redirect_uris", json!(["https://a.example/cb#f"]))).unwrap_err();
        assert!(err.to_string().contains("redirect_uris[0]"), "{err}");
        let err = parse(with("scope", json!(["a"]))).unwrap_err();
        assert!(err.to_string().contains("scope must be a string"), "{err}");
    }

    #[test]
    fn shared_secrets_are_refused() {
        for method in [
            "client_secret_basic",
            "client_secret_post",
            "client_secret_jwt",
        ] {
            let err = parse(with("token_endpoint_auth_method", json!(method))).unwrap_err();
            assert!(matches!(err, DocumentError::SharedSecret(_)), "{method}");
            assert!(err.to_string().contains(method), "{err}");
        }
        let err = parse(with("client_secret", json!("s3cret"))).unwrap_err();
        assert_eq!(err, DocumentError::SharedSecret("client_secret".into()));
        let err = parse(with("token_endpoint_auth_method", json!("tls_client_auth"))).unwrap_err();
        assert!(matches!(err, DocumentError::UnsupportedAuthMethod(_)));
    }

    #[test]
    fn private_key_jwt_needs_exactly_one_key_source() {
        let jwks = json!({"keys": [{"kty": "EC", "crv": "P-256", "x": "x", "y": "y"}]});
        let mut doc = with("token_endpoint_auth_method", json!("private_key_jwt"));
        assert_eq!(parse(doc.clone()), Err(DocumentError::MissingKeys));
        doc["jwks"] = jwks.clone();
        assert_eq!(
            parse(doc.clone()).unwrap().auth,
            ClientAuth::PrivateKeyJwt(KeySource::Jwks(jwks))
        );
        doc["jwks_uri"] = json!("https://app.example.com/jwks.json");
        assert_eq!(parse(doc.clone()), Err(DocumentError::MissingKeys));
        doc.as_object_mut().unwrap().remove("jwks");
        assert_eq!(
            parse(doc.clone()).unwrap().auth,
            ClientAuth::PrivateKeyJwt(KeySource::JwksUri(
                "https://app.example.com/jwks.json".into()
            ))
        );
        doc["jwks_uri"] = json!("http://app.example.com/jwks.json");
        assert_eq!(parse(doc), Err(DocumentError::MissingKeys));
    }

    #[test]
    fn only_the_code_flow_is_accepted() {
        assert!(
            parse(with(
                "grant_types",
                json!(["authorization_code", "refresh_token"])
            ))
            .is_ok()
        );
        let err = parse(with("grant_types", json!(["client_credentials"]))).unwrap_err();
        assert!(err.to_string().contains("client_credentials"), "{err}");
        let err = parse(with("response_types", json!(["token"]))).unwrap_err();
        assert!(matches!(
            err,
            DocumentError::UnsupportedFlow {
                field: "response_types",
                ..
            }
        ));
    }
}
