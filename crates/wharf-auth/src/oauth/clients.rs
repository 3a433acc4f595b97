//! The HTTP clients that reach an authorization server (or an upstream provider): a URL on
//! this machine is reached directly, any other through the environment's proxy.

/// Two clients built alike. [`HttpClients::to`] gives the direct one for a URL on this
/// machine (`localhost`, a loopback address), whatever `HTTP_PROXY`, `HTTPS_PROXY` or
/// `ALL_PROXY` say: through a proxy, "localhost" is the proxy's own machine, which could
/// answer with keys of its choosing and read plain-http credentials. Any other URL gets the
/// one that follows the environment's proxy settings, as reqwest does by default.
#[derive(Debug, Clone)]
pub struct HttpClients {
    direct: reqwest::Client,
    proxied: reqwest::Client,
}

impl HttpClients {
    /// Builds both from `builder` (timeouts, redirect policy, TLS roots).
    pub fn new(builder: impl Fn() -> reqwest::ClientBuilder) -> reqwest::Result<Self> {
        Ok(Self {
            direct: builder().no_proxy().build()?,
            proxied: builder().build()?,
        })
    }

    /// The client for `url`.
    pub fn to(&self, url: &str) -> &reqwest::Client {
        if is_loopback_url(url) {
            &self.direct
        } else {
            &self.proxied
        }
    }
}

impl Default for HttpClients {
    /// Both with reqwest's defaults (the direct one without a proxy).
    fn default() -> Self {
        Self {
            direct: reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap_or_default(),
            proxied: reqwest::Client::default(),
        }
    }
}

/// Whether `url` names this machine: `localhost` or a loopback address.
pub fn is_loopback_url(url: &str) -> bool {
    reqwest::Url::parse(url).is_ok_and(|u| is_loopback(&u))
}

/// [`is_loopback_url`] of a parsed URL.
pub(crate) fn is_loopback(url: &reqwest::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_urls_on_this_machine_skip_the_proxy() {
        let clients = HttpClients::new(reqwest::Client::builder).unwrap();
        for here in [
            "http://127.0.0.1:8080/jwks",
            "http://LOCALHOST/x",
            "http://[::1]:9/",
            "https://127.0.0.2/",
        ] {
            assert!(std::ptr::eq(clients.to(here), &clients.direct), "{here}");
        }
        for away in [
            "https://issuer.example.com/",
            "https://localhost.example.com/",
            "http://10.0.0.1/",
            "not a url",
        ] {
            assert!(std::ptr::eq(clients.to(away), &clients.proxied), "{away}");
        }
    }
}
