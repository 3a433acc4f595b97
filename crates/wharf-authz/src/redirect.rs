//! Redirect URIs: what a client may register for its `application_type` (OpenID Connect
//! Registration 1.0 §2, as the 2026-07-28 client-registration page asks), and how an
//! authorization request's `redirect_uri` is matched against what was registered (OAuth 2.1
//! §2.3.1: exact string comparison, except the port of a loopback redirect, §8.4.2).

use std::net::IpAddr;

use url::{Host, Url};

/// Schemes no redirect may use, whatever the application: they run or read something in
/// the browser instead of handing the code to an application.
const FORBIDDEN_SCHEMES: &[&str] = &[
    "javascript",
    "data",
    "vbscript",
    "file",
    "about",
    "blob",
    "filesystem",
    "view-source",
    "ws",
    "wss",
    "ftp",
    "intent",
    "jar",
    "mailto",
    "tel",
    "sms",
    "ms-msdt",
    "search-ms",
];

/// The kind of client, which decides where its redirects may go. A registration that omits
/// it is `web`, the OpenID Connect default the 2026-07-28 specification names, unless every
/// redirect it registers is one only a native client has (see
/// [`ApplicationType::of_registration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ApplicationType {
    /// A browser-based application on a remote host: `https` redirects off loopback.
    #[default]
    Web,
    /// A desktop, mobile or command-line application: loopback `http` or a private-use
    /// (custom) scheme.
    Native,
}

impl ApplicationType {
    /// Reads the registration's `application_type`; `None` when absent means `web`.
    pub fn parse(value: Option<&str>) -> Result<Self, RedirectError> {
        match value {
            None | Some("web") => Ok(Self::Web),
            Some("native") => Ok(Self::Native),
            Some(other) => Err(RedirectError::UnknownApplicationType(other.to_owned())),
        }
    }

    /// The application type of a registration: as it says, or, when it names none and every
    /// redirect URI is loopback `http` or a private-use scheme, `native`. Native clients in
    /// use (older SDKs among them) register so; only `web` would refuse all of their
    /// redirects. An explicit `web` stays `web`.
    pub fn of_registration(value: Option<&str>, uris: &[String]) -> Result<Self, RedirectError> {
        let native_only = !uris.is_empty()
            && uris
                .iter()
                .all(|uri| check_one(Self::Native, 0, uri).is_ok());
        match value {
            None if native_only => Ok(Self::Native),
            _ => Self::parse(value),
        }
    }

    /// The value as registered.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Web => "web",
            Self::Native => "native",
        }
    }
}

/// Why a registration's redirect URIs are refused. Each message names the field (and the
/// index in `redirect_uris`) and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RedirectError {
    /// `application_type` other than `web` or `native`.
    #[error("application_type {0:?} is not supported: use \"web\" or \"native\"")]
    UnknownApplicationType(String),
    /// No redirect URI at all.
    #[error("redirect_uris is required and must list at least one URI")]
    Empty,
    /// Not an absolute URI.
    #[error("redirect_uris[{index}] {uri:?} is not an absolute URI")]
    NotAbsolute {
        /// Position in `redirect_uris`.
        index: usize,
        /// The URI as sent.
        uri: String,
    },
    /// A fragment, which RFC 6749 §3.1.2 forbids.
    #[error("redirect_uris[{index}] {uri:?} has a fragment, which redirect URIs must not have")]
    Fragment {
        /// Position in `redirect_uris`.
        index: usize,
        /// The URI as sent.
        uri: String,
    },
    /// A scheme that would run or read something in the browser.
    #[error("redirect_uris[{index}] {uri:?} uses the {scheme}: scheme, which is never allowed")]
    ForbiddenScheme {
        /// Position in `redirect_uris`.
        index: usize,
        /// The URI as sent.
        uri: String,
        /// Its scheme.
        scheme: String,
    },
    /// A `web` client's redirect that is not `https` on a non-loopback host.
    #[error(
        "redirect_uris[{index}] {uri:?} is not allowed for application_type \"web\": web clients redirect to https on a non-loopback host; a desktop or command-line client registers with application_type \"native\""
    )]
    WebNeedsHttps {
        /// Position in `redirect_uris`.
        index: usize,
        /// The URI as sent.
        uri: String,
    },
    /// A `native` client's redirect that is neither loopback `http` nor a custom scheme.
    #[error(
        "redirect_uris[{index}] {uri:?} is not allowed for application_type \"native\": native clients redirect to http on localhost, 127.0.0.1 or [::1], or to a private-use scheme such as com.example.app:/callback"
    )]
    NativeNeedsLoopbackOrCustomScheme {
        /// Position in `redirect_uris`.
        index: usize,
        /// The URI as sent.
        uri: String,
    },
    /// A metadata document's redirect that is plain `http` off loopback.
    #[error(
        "redirect_uris[{index}] {uri:?} is plain http to a host other than this machine's, where a code could be read on its way: use https, http on localhost, 127.0.0.1 or [::1], or a private-use scheme"
    )]
    DocumentNeedsHttps {
        /// Position in `redirect_uris`.
        index: usize,
        /// The URI as sent.
        uri: String,
    },
}

/// Checks every redirect URI a client registers against its application type.
pub fn check_registration(
    application_type: ApplicationType,
    uris: &[String],
) -> Result<(), RedirectError> {
    if uris.is_empty() {
        return Err(RedirectError::Empty);
    }
    for (index, uri) in uris.iter().enumerate() {
        check_one(application_type, index, uri)?;
    }
    Ok(())
}

/// The rules every redirect URI follows whoever the client is: absolute, no fragment, no
/// scheme that runs or reads something in the browser. The entry is `redirect_uris[index]`.
pub fn check_shape(index: usize, uri: &str) -> Result<Url, RedirectError> {
    let owned = || uri.to_owned();
    let parsed = Url::parse(uri).map_err(|_| RedirectError::NotAbsolute {
        index,
        uri: owned(),
    })?;
    if parsed.fragment().is_some() {
        return Err(RedirectError::Fragment {
            index,
            uri: owned(),
        });
    }
    if FORBIDDEN_SCHEMES.contains(&parsed.scheme()) {
        return Err(RedirectError::ForbiddenScheme {
            index,
            uri: owned(),
            scheme: parsed.scheme().to_owned(),
        });
    }
    Ok(parsed)
}

/// Checks a redirect URI of a client metadata document, which names no application type:
/// `https`, `http` on a loopback host, or a private-use scheme (every redirect must be one of
/// the first two in MCP's authorization; RFC 8252 adds the third for native apps). The entry
/// is `redirect_uris[index]`.
pub fn check_document(index: usize, uri: &str) -> Result<(), RedirectError> {
    let parsed = check_shape(index, uri)?;
    let allowed = match parsed.scheme() {
        "https" => parsed.host().is_some(),
        "http" => is_loopback_host(&parsed),
        _ => true,
    };
    if allowed {
        Ok(())
    } else {
        Err(RedirectError::DocumentNeedsHttps {
            index,
            uri: uri.to_owned(),
        })
    }
}

fn check_one(
    application_type: ApplicationType,
    index: usize,
    uri: &str,
) -> Result<(), RedirectError> {
    let owned = || uri.to_owned();
    let parsed = check_shape(index, uri)?;
    let scheme = parsed.scheme();
    let loopback = is_loopback_host(&parsed);
    let allowed = match application_type {
        ApplicationType::Web => scheme == "https" && parsed.host().is_some() && !loopback,
        ApplicationType::Native => match scheme {
            "http" => loopback,
            "https" => false,
            // A private-use scheme (RFC 8252 §7.1).
            _ => true,
        },
    };
    if allowed {
        Ok(())
    } else if application_type == ApplicationType::Web {
        Err(RedirectError::WebNeedsHttps {
            index,
            uri: owned(),
        })
    } else {
        Err(RedirectError::NativeNeedsLoopbackOrCustomScheme {
            index,
            uri: owned(),
        })
    }
}

/// Whether an authorization request's `redirect_uri` is one of the client's, compared as
/// strings. The one exception is OAuth 2.1 §8.4.2's (RFC 8252 §7.3): for an `http` redirect
/// to a loopback IP literal or to `localhost`, a native app picks its port when it starts,
/// so the port may differ. Registered clients list `http://localhost/callback` and expect
/// any port on it.
pub fn is_registered(registered: &[String], presented: &str) -> bool {
    if registered.iter().any(|r| r == presented) {
        return true;
    }
    let Some(presented) = loopback_redirect(presented) else {
        return false;
    };
    registered
        .iter()
        .filter_map(|r| loopback_redirect(r))
        .any(|r| without_port(&r) == without_port(&presented))
}

/// The URL, when it is an `http` redirect to 127.0.0.0/8, `[::1]` or exactly `localhost`
/// with no fragment.
fn loopback_redirect(uri: &str) -> Option<Url> {
    let url = Url::parse(uri).ok()?;
    let loopback = match url.host()? {
        Host::Ipv4(ip) => ip.is_loopback(),
        Host::Ipv6(ip) => ip.is_loopback(),
        // The parser has lowercased it; a subdomain or trailing dot stays exact.
        Host::Domain(name) => name == "localhost",
    };
    (url.scheme() == "http" && loopback && url.fragment().is_none()).then_some(url)
}

fn without_port(url: &Url) -> String {
    let mut url = url.clone();
    // An http URL with a host always accepts a port change; the fallback keeps the
    // comparison meaningful regardless.
    if url.set_port(None).is_err() {
        return url.to_string();
    }
    url.to_string()
}

/// Whether `uri` goes to this machine: its host is [loopback](is_loopback_host).
pub(crate) fn is_loopback_uri(uri: &str) -> bool {
    Url::parse(uri).is_ok_and(|url| is_loopback_host(&url))
}

/// `localhost` (and its subdomains, RFC 6761 §6.3), with or without the root's trailing
/// dot, or a loopback IP literal.
fn is_loopback_host(url: &Url) -> bool {
    match url.host() {
        Some(Host::Domain(name)) => {
            let name = name.trim_end_matches('.');
            name.eq_ignore_ascii_case("localhost")
                || name.to_ascii_lowercase().ends_with(".localhost")
        }
        Some(Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(kind: ApplicationType, uri: &str) -> Result<(), RedirectError> {
        check_registration(kind, &[uri.to_owned()])
    }

    /// What registration accepts as loopback is what the consent page warns about: one
    /// judgement, the trailing dot included.
    #[test]
    fn loopback_is_judged_alike_everywhere() {
        for uri in [
            "http://localhost:8080/cb",
            "http://localhost.:8080/cb",
            "http://LOCALHOST./cb",
            "http://app.localhost./cb",
            "http://127.0.0.1:9/cb",
            "http://[::1]:9/cb",
        ] {
            assert!(is_loopback_uri(uri), "{uri}");
            assert_eq!(check(ApplicationType::Native, uri), Ok(()), "{uri}");
        }
        for uri in [
            "https://example.com/cb",
            "http://localhost.example.com/cb",
            "com.example.app:/cb",
        ] {
            assert!(!is_loopback_uri(uri), "{uri}");
        }
    }

    #[test]
    fn application_type_defaults_to_web_and_names_unknown_values() {
        assert_eq!(ApplicationType::parse(None), Ok(ApplicationType::Web));
        assert_eq!(
            ApplicationType::parse(Some("native")),
            Ok(ApplicationType::Native)
        );
        let err = ApplicationType::parse(Some("desktop")).unwrap_err();
        assert!(
            err.to_string().contains("application_type \"desktop\""),
            "{err}"
        );
    }

    #[test]
    fn web_clients_redirect_to_https_off_loopback() {
        let web = ApplicationType::Web;
        assert_eq!(check(web, "https://app.example.com/cb"), Ok(()));
        for bad in [
            "http://app.example.com/cb",
            "https://localhost/cb",
            "https://127.0.0.1:8080/cb",
            "https://[::1]/cb",
            "https://auth.localhost/cb",
            "com.example.app:/cb",
        ] {
            let err = check(web, bad).unwrap_err();
            assert!(
                matches!(err, RedirectError::WebNeedsHttps { index: 0, .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("application_type \"web\""));
        }
    }

    #[test]
    fn documents_redirect_to_https_loopback_http_or_a_private_scheme() {
        for good in [
            "https://app.example.com/cb",
            "http://localhost:3000/callback",
            "http://127.0.0.1:49152/cb",
            "http://[::1]/cb",
            "com.example.app:/oauth2redirect",
        ] {
            assert_eq!(check_document(0, good), Ok(()), "{good}");
        }
        for bad in ["http://app.example.com/cb", "http://192.168.1.10/cb"] {
            assert!(
                matches!(
                    check_document(3, bad),
                    Err(RedirectError::DocumentNeedsHttps { index: 3, .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            check_document(0, "javascript:alert(1)"),
            Err(RedirectError::ForbiddenScheme { .. })
        ));
    }

    #[test]
    fn native_clients_redirect_to_loopback_http_or_a_private_scheme() {
        let native = ApplicationType::Native;
        for good in [
            "http://localhost:3000/callback",
            "http://127.0.0.1:49152/cb",
            "http://[::1]/cb",
            "com.example.app:/oauth2redirect",
            "cursor://anysphere.cursor-mcp/oauth/callback",
        ] {
            assert_eq!(check(native, good), Ok(()), "{good}");
        }
        for bad in ["https://app.example.com/cb", "http://app.example.com/cb"] {
            assert!(
                matches!(
                    check(native, bad),
                    Err(RedirectError::NativeNeedsLoopbackOrCustomScheme { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn every_client_is_refused_fragments_dangerous_schemes_and_relative_uris() {
        for kind in [ApplicationType::Web, ApplicationType::Native] {
            assert!(matches!(
                check(kind, "https://app.example.com/cb#x"),
                Err(RedirectError::Fragment { .. })
            ));
            assert!(matches!(
                check(kind, "javascript:alert(1)"),
                Err(RedirectError::ForbiddenScheme { .. })
            ));
            assert!(matches!(
                check(kind, "/callback"),
                Err(RedirectError::NotAbsolute { .. })
            ));
            assert_eq!(check_registration(kind, &[]), Err(RedirectError::Empty));
        }
        // The index names which entry is wrong.
        let uris = [
            "https://a.example/cb".to_owned(),
            "http://b.example/cb".to_owned(),
        ];
        let err = check_registration(ApplicationType::Web, &uris).unwrap_err();
        assert!(err.to_string().starts_with("redirect_uris[1]"), "{err}");
    }

    #[test]
    fn redirects_match_exactly_except_a_loopback_port() {
        let registered = [
            "https://app.example.com/cb".to_owned(),
            "http://127.0.0.1:3000/cb".to_owned(),
            "http://localhost/callback".to_owned(),
        ];
        assert!(is_registered(&registered, "https://app.example.com/cb"));
        for other in [
            "https://app.example.com/cb/",
            "https://app.example.com/cb?x=1",
            "https://APP.example.com/cb",
            "https://app.example.com:443/cb",
            "http://127.0.0.1:4000/other",
            "http://127.0.0.2:3000/cb",
            // The port only: host, scheme, path and query stay exact.
            "http://127.0.0.1:53124/callback",
            "http://localhost:53124/cb",
            "http://localhost:53124/callback?x=1",
            "https://localhost:53124/callback",
            "http://app.localhost:53124/callback",
            "http://localhost.:53124/callback",
        ] {
            assert!(!is_registered(&registered, other), "{other}");
        }
        for port_chosen in [
            "http://127.0.0.1:51234/cb",
            "http://127.0.0.1/cb",
            "http://localhost:53124/callback",
            "http://LOCALHOST:53124/callback",
        ] {
            assert!(is_registered(&registered, port_chosen), "{port_chosen}");
        }
    }

    #[test]
    fn a_registration_without_application_type_is_native_when_only_native_redirects() {
        let of = |value: Option<&str>, uris: &[&str]| {
            let uris: Vec<String> = uris.iter().map(|u| (*u).to_owned()).collect();
            ApplicationType::of_registration(value, &uris)
        };
        assert_eq!(
            of(None, &["http://127.0.0.1:19876/cb", "com.example.app:/cb"]),
            Ok(ApplicationType::Native)
        );
        assert_eq!(
            of(
                None,
                &["http://127.0.0.1:19876/cb", "https://app.example.com/cb"]
            ),
            Ok(ApplicationType::Web)
        );
        assert_eq!(of(None, &[]), Ok(ApplicationType::Web));
        // Said explicitly, web stays strict.
        assert_eq!(
            of(Some("web"), &["http://127.0.0.1:19876/cb"]),
            Ok(ApplicationType::Web)
        );
        assert!(of(Some("desktop"), &["http://127.0.0.1/cb"]).is_err());
    }
}
