//! Per-address rate limits on the endpoints anyone can call: registration, token requests,
//! authorization requests and sign-in attempts. Kept in each replica's memory (a limit of N
//! per minute admits up to N per replica), counted per IPv4 address and per IPv6 /64 (what
//! one host usually holds), forgotten once idle.

use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// How often, in checks, idle addresses are dropped from a limiter's memory.
const CLEANUP_EVERY: u64 = 1024;

/// One endpoint's limit.
pub(crate) struct Limit {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
    checks: AtomicU64,
}

impl Limit {
    pub(crate) fn per_minute(n: u32) -> Self {
        let quota = Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN));
        Self {
            limiter: RateLimiter::keyed(quota),
            checks: AtomicU64::new(0),
        }
    }

    /// Whether one more request from `peer` fits. Without a known peer (a listener that
    /// does not say), every request shares one budget.
    pub(crate) fn allows(&self, peer: Option<IpAddr>) -> bool {
        if self.checks.fetch_add(1, Ordering::Relaxed) % CLEANUP_EVERY == CLEANUP_EVERY - 1 {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
        let key = match peer {
            Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
            },
            Some(v4) => v4,
            None => IpAddr::from([0, 0, 0, 0]),
        };
        self.limiter.check_key(&key).is_ok()
    }
}

/// The address a request counts against: `peer`, unless it is one of the `trusted` proxies;
/// then, walking `X-Forwarded-For` from its end (the hop nearest this server), the first
/// address that is not a trusted proxy. An entry that is not an address stops the walk at
/// the proxy that wrote it: the request counts against that proxy, as without the header.
pub(crate) fn client_address(
    peer: IpAddr,
    headers: &http::HeaderMap,
    trusted: &[ipnet::IpNet],
) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(&ip.to_canonical()));
    let mut client = peer.to_canonical();
    if !is_trusted(&client) {
        return client;
    }
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect();
    for hop in hops.iter().rev() {
        let Ok(ip) = hop.trim().parse::<IpAddr>() else {
            return client;
        };
        client = ip.to_canonical();
        if !is_trusted(&client) {
            return client;
        }
    }
    client
}

/// Every endpoint's limit.
pub(crate) struct Limits {
    pub(crate) registrations: Limit,
    pub(crate) token_requests: Limit,
    pub(crate) authorizations: Limit,
    pub(crate) sign_ins: Limit,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarded(peer: &str, hops: &[&str], trusted: &[&str]) -> IpAddr {
        let mut headers = http::HeaderMap::new();
        for h in hops {
            headers.append("x-forwarded-for", h.parse().unwrap());
        }
        let trusted: Vec<ipnet::IpNet> = trusted.iter().map(|n| n.parse().unwrap()).collect();
        client_address(peer.parse().unwrap(), &headers, &trusted)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_trusted_proxy_names_the_client_and_nobody_else_does() {
        let proxies = ["10.0.0.0/8", "::1/128"];
        // Behind the proxy: the client it names.
        assert_eq!(
            forwarded("10.0.0.2", &["203.0.113.5"], &proxies),
            ip("203.0.113.5")
        );
        // A client that forges the header itself is counted as the address the proxy saw.
        assert_eq!(
            forwarded("10.0.0.2", &["198.51.100.1, 203.0.113.5"], &proxies),
            ip("203.0.113.5")
        );
        // Two trusted hops, headers split over two fields.
        assert_eq!(
            forwarded("10.0.0.2", &["203.0.113.5", "10.0.0.9"], &proxies),
            ip("203.0.113.5")
        );
        // Not from a trusted proxy: the header is ignored.
        assert_eq!(
            forwarded("192.0.2.7", &["203.0.113.5"], &proxies),
            ip("192.0.2.7")
        );
        assert_eq!(forwarded("10.0.0.2", &["203.0.113.5"], &[]), ip("10.0.0.2"));
        // No header, or one that is not an address: the proxy itself.
        assert_eq!(forwarded("10.0.0.2", &[], &proxies), ip("10.0.0.2"));
        assert_eq!(
            forwarded("10.0.0.2", &["unknown"], &proxies),
            ip("10.0.0.2")
        );
        assert_eq!(
            forwarded("10.0.0.2", &["203.0.113.5, junk"], &proxies),
            ip("10.0.0.2")
        );
        // An IPv4-mapped peer is the IPv4 address it maps.
        assert_eq!(
            forwarded("::ffff:10.0.0.2", &["2001:db8::1"], &proxies),
            ip("2001:db8::1")
        );
    }

    #[test]
    fn an_ipv6_host_counts_by_its_64_and_others_are_apart() {
        let limit = Limit::per_minute(2);
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert!(limit.allows(Some(a)));
        assert!(limit.allows(Some(b)));
        assert!(!limit.allows(Some(a)), "the same /64");
        assert!(
            limit.allows(Some("2001:db8:1:3::1".parse().unwrap())),
            "another /64"
        );
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        assert!(limit.allows(Some(v4)));
        assert!(limit.allows(Some("::ffff:192.0.2.7".parse().unwrap())));
        assert!(!limit.allows(Some(v4)), "mapped and plain are one host");
    }
}
