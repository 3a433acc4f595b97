//! Addresses an authorization server must never fetch from on a client's say-so: the IANA
//! special-purpose address registries (RFC 6890 and its updates), which hold private
//! networks, loopback, link-local (cloud metadata services live at 169.254.169.254),
//! shared CGNAT space, documentation, benchmarking, multicast and reserved blocks.
//!
//! IPv6 is judged by what it reaches: only global unicast (2000::/3) outside its own special
//! blocks passes, and an address that embeds an IPv4 one (IPv4-mapped, NAT64) is judged by
//! the IPv4 address inside.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A special-use block an address fell in: its CIDR and what it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialUse {
    /// The block, as CIDR.
    pub block: &'static str,
    /// What the block is, in words.
    pub purpose: &'static str,
}

impl fmt::Display for SpecialUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.block, self.purpose)
    }
}

/// IPv4 special-purpose blocks that are not globally reachable, as (network, prefix length,
/// CIDR, purpose).
const V4: &[(u32, u8, &str, &str)] = &[
    (0x0000_0000, 8, "0.0.0.0/8", "this network"),
    (0x0a00_0000, 8, "10.0.0.0/8", "private network"),
    (0x6440_0000, 10, "100.64.0.0/10", "shared address space"),
    (0x7f00_0000, 8, "127.0.0.0/8", "loopback"),
    (
        0xa9fe_0000,
        16,
        "169.254.0.0/16",
        "link-local, where cloud metadata services answer",
    ),
    (0xac10_0000, 12, "172.16.0.0/12", "private network"),
    (0xc000_0000, 24, "192.0.0.0/24", "IETF protocol assignments"),
    (0xc000_0200, 24, "192.0.2.0/24", "documentation"),
    (0xc058_6300, 24, "192.88.99.0/24", "6to4 relay anycast"),
    (0xc0a8_0000, 16, "192.168.0.0/16", "private network"),
    (0xc612_0000, 15, "198.18.0.0/15", "benchmarking"),
    (0xc633_6400, 24, "198.51.100.0/24", "documentation"),
    (0xcb00_7100, 24, "203.0.113.0/24", "documentation"),
    (0xe000_0000, 4, "224.0.0.0/4", "multicast"),
    (
        0xf000_0000,
        4,
        "240.0.0.0/4",
        "reserved, and the broadcast address",
    ),
];

/// IPv6 blocks inside global unicast (2000::/3) that are not globally reachable.
const V6: &[(u128, u8, &str, &str)] = &[
    (
        0x2001_0000 << 96,
        23,
        "2001::/23",
        "IETF protocol assignments, Teredo included",
    ),
    (0x2001_0db8 << 96, 32, "2001:db8::/32", "documentation"),
    (0x2002_0000 << 96, 16, "2002::/16", "6to4"),
    (0x3fff_0000 << 96, 20, "3fff::/20", "documentation"),
];

const NOT_GLOBAL_V6: SpecialUse = SpecialUse {
    block: "outside 2000::/3",
    purpose: "not global unicast: loopback, link-local, unique local, multicast or reserved",
};

const NAT64_LOCAL: SpecialUse = SpecialUse {
    block: "64:ff9b:1::/48",
    purpose: "local-use IPv4/IPv6 translation",
};

/// The special-use block `ip` is in, or `None` for an address on the public internet.
pub fn special_use(ip: IpAddr) -> Option<SpecialUse> {
    match ip {
        IpAddr::V4(ip) => special_use_v4(ip),
        IpAddr::V6(ip) => special_use_v6(ip),
    }
}

/// Whether `ip` is loopback (127.0.0.0/8, `::1`, or IPv4-mapped loopback).
pub(crate) fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => ip.is_loopback(),
        IpAddr::V6(ip) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

fn special_use_v4(ip: Ipv4Addr) -> Option<SpecialUse> {
    let bits = u32::from(ip);
    V4.iter()
        .find(|(net, len, ..)| bits & mask32(*len) == *net)
        .map(|&(_, _, block, purpose)| SpecialUse { block, purpose })
}

fn special_use_v6(ip: Ipv6Addr) -> Option<SpecialUse> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return special_use_v4(v4);
    }
    let bits = u128::from(ip);
    // NAT64's well-known prefix (RFC 6052) carries an IPv4 address in its last 32 bits.
    if bits & mask128(96) == 0x0064_ff9b << 96 {
        return special_use_v4(Ipv4Addr::from(bits as u32));
    }
    if bits & mask128(48) == (0x0064_ff9b_0001u128 << 80) {
        return Some(NAT64_LOCAL);
    }
    if bits & mask128(3) != 0x2000 << 112 {
        return Some(NOT_GLOBAL_V6);
    }
    V6.iter()
        .find(|(net, len, ..)| bits & mask128(*len) == *net)
        .map(|&(_, _, block, purpose)| SpecialUse { block, purpose })
}

fn mask32(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

fn mask128(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(ip: &str) -> Option<&'static str> {
        special_use(ip.parse().unwrap()).map(|s| s.block)
    }

    #[test]
    fn every_ipv4_block_is_refused_at_both_ends() {
        for &(net, len, cidr, _) in V4 {
            let last = net | !mask32(len);
            for bits in [net, last] {
                let ip = Ipv4Addr::from(bits);
                assert_eq!(block(&ip.to_string()), Some(cidr), "{ip}");
                // The same address reached through IPv6 is refused the same way.
                assert_eq!(
                    block(&ip.to_ipv6_mapped().to_string()),
                    Some(cidr),
                    "{ip} mapped"
                );
                assert_eq!(block(&format!("64:ff9b::{ip}")), Some(cidr), "{ip} NAT64");
            }
        }
    }

    #[test]
    fn the_addresses_an_attacker_reaches_for_are_refused() {
        for ip in [
            "169.254.169.254",
            "100.100.100.200",
            "127.0.0.1",
            "0.0.0.0",
            "10.1.2.3",
            "172.31.255.255",
            "192.168.1.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "fc00::1",
            "ff02::1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b:1::a00:1",
            "2001:db8::1",
            "2001::1",
            "2002:a00:1::1",
        ] {
            assert!(
                special_use(ip.parse().unwrap()).is_some(),
                "{ip} must be refused"
            );
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "93.184.215.14",
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
            "64:ff9b::808:808",
        ] {
            assert_eq!(block(ip), None, "{ip} is public");
        }
    }

    #[test]
    fn loopback_is_recognised_through_every_spelling() {
        for ip in ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(ip.parse().unwrap()), "{ip}");
        }
        assert!(!is_loopback("10.0.0.1".parse().unwrap()));
    }
}
