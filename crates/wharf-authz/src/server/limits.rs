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
