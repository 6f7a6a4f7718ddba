//! Addresses as the kernel keeps them: IPv6, with IPv4 as v4-mapped (`::ffff:a.b.c.d`), and
//! ordered as `rds_addr_cmp` orders them (the 16 bytes, big-endian, lexicographically).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An RDS address: 16 bytes, IPv4 mapped into IPv6. `Ord` is `rds_addr_cmp`'s order, which
/// decides who connects first (the lower address) on stream transports.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Addr(pub Ipv6Addr);

impl Addr {
    /// The unspecified address (`in6addr_any`): "not bound", "no destination".
    pub const ANY: Self = Self(Ipv6Addr::UNSPECIFIED);

    /// The address of `ip` (IPv4 becomes v4-mapped).
    pub fn new(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self(v4.to_ipv6_mapped()),
            IpAddr::V6(v6) => Self(v6),
        }
    }

    /// Back to an `IpAddr` (v4-mapped becomes IPv4).
    pub fn ip(self) -> IpAddr {
        match self.v4() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(self.0),
        }
    }

    /// The IPv4 address if this is v4-mapped.
    pub fn v4(self) -> Option<Ipv4Addr> {
        self.0.to_ipv4_mapped()
    }

    /// True for IPv4 (v4-mapped).
    pub fn is_v4(self) -> bool {
        self.v4().is_some()
    }

    /// True for the unspecified address.
    pub fn is_any(self) -> bool {
        self.0.is_unspecified()
    }

    /// True for a loopback address (127.0.0.0/8 or `::1`): the kernel binds such sockets to
    /// its loopback transport.
    pub fn is_loopback(self) -> bool {
        match self.v4() {
            Some(v4) => v4.is_loopback(),
            None => self.0.is_loopback(),
        }
    }

    /// True for an IPv6 link-local unicast address (`fe80::/10`), which needs a scope id.
    pub fn is_link_local(self) -> bool {
        self.v4().is_none() && (self.0.segments()[0] & 0xffc0) == 0xfe80
    }

    /// Checks an address a socket binds to or sends to, as `rds_bind` and `rds_sendmsg` do:
    /// IPv4 must not be any, broadcast or multicast; IPv6 must be unicast (or v4-mapped with
    /// the IPv4 rules).
    ///
    /// # Errors
    ///
    /// A static reason, for `EINVAL`.
    pub fn check_unicast(self) -> Result<(), &'static str> {
        if let Some(v4) = self.v4() {
            if v4.is_unspecified() {
                return Err(
                    "the IPv4 address is INADDR_ANY; RDS has no wildcard, name one address",
                );
            }
            if v4.is_broadcast() {
                return Err("the IPv4 address is the broadcast address; RDS is unicast only");
            }
            if v4.is_multicast() {
                return Err("the IPv4 address is multicast; RDS is unicast only");
            }
            return Ok(());
        }
        if self.0.is_unspecified() {
            return Err(
                "the IPv6 address is unspecified (::); RDS has no wildcard, name one address",
            );
        }
        if self.0.is_multicast() {
            return Err("the IPv6 address is multicast; RDS is unicast only");
        }
        Ok(())
    }
}

impl Default for Addr {
    fn default() -> Self {
        Self::ANY
    }
}

impl From<IpAddr> for Addr {
    fn from(ip: IpAddr) -> Self {
        Self::new(ip)
    }
}

impl core::fmt::Debug for Addr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.ip())
    }
}

impl core::fmt::Display for Addr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.ip())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_addr_order_is_rds_addr_cmp() {
        let a = Addr::new("10.0.0.1".parse().unwrap());
        let b = Addr::new("10.0.0.2".parse().unwrap());
        let c = Addr::new("2001:db8::1".parse().unwrap());
        assert!(a < b, "numerically smaller IPv4 is smaller");
        assert!(a < c, "v4-mapped (::ffff:...) sorts before 2001:...");
        assert_eq!(a.ip(), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert!(a.is_v4() && !c.is_v4());
    }

    #[test]
    fn test_addr_unicast_rules() {
        for bad in ["0.0.0.0", "255.255.255.255", "224.0.0.1", "::", "ff02::1"] {
            assert!(
                Addr::new(bad.parse().unwrap()).check_unicast().is_err(),
                "{bad}"
            );
        }
        for good in ["10.0.0.1", "127.0.0.1", "::1", "fe80::1", "2001:db8::2"] {
            assert!(
                Addr::new(good.parse().unwrap()).check_unicast().is_ok(),
                "{good}"
            );
        }
        assert!(Addr::new("fe80::1".parse().unwrap()).is_link_local());
        assert!(Addr::new("127.0.0.9".parse().unwrap()).is_loopback());
        assert!(Addr::new("::1".parse().unwrap()).is_loopback());
    }
}
