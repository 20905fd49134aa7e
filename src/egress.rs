//! Where the operator and the agent may connect: one address deny list, checked on the addresses
//! actually dialled. The operator's probes use it (`--probe-deny-cidrs`), and so does every
//! outbound request of the agent (`--egress-deny-cidrs`): remote MCP servers, OAuth, approval
//! webhooks and the upstream model.
//!
//! - **Checked where it is dialled.** A name is resolved here (the system resolver) and denied
//!   addresses are dropped before a connection is made, so a name that resolves somewhere else
//!   later (DNS rebinding) is checked again; a URL whose host is an IP literal is checked before
//!   the request ([`literal_ip`] reads every spelling the URL parser normalises: `2130706433`,
//!   `0x7f.1`, `[::ffff:127.0.0.1]`). An IPv4 address written as IPv6 is checked as IPv4.
//! - **No proxy while the list is not empty.** A proxy would dial the destination itself, past
//!   the check; `HTTP(S)_PROXY` is ignored then (an empty list uses it again).
//! - **Defaults.** Link-local (cloud metadata at 169.254.169.254 and `fe80::/10`), the metadata
//!   addresses outside it (AWS IMDS over IPv6 `fd00:ec2::254`, Alibaba Cloud `100.100.100.200`)
//!   and "this host" (`0.0.0.0/8`, `::`: dialling them reaches loopback). The probe and an agent
//!   in a pod also deny loopback: the operator's own pod and node-local services are not the URL
//!   author's to reach, and a pod's stdio sidecars are reached over Unix sockets, never TCP. An
//!   agent in local mode reaches loopback (the developer's own servers).

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ipnet::IpNet;

/// The words every denial's message holds, so a caller can tell a denial from a failure (it
/// lasts until the URL or the list changes) without parsing anything else.
pub(crate) const DENIED: &str = "does not connect to";

/// Whether `message` holds [`DENIED`] (for const checks of the messages).
pub(crate) const fn is_denial(message: &str) -> bool {
    let (m, d) = (message.as_bytes(), DENIED.as_bytes());
    let mut i = 0;
    while i + d.len() <= m.len() {
        let mut j = 0;
        while j < d.len() && m[i + j] == d[j] {
            j += 1;
        }
        if j == d.len() {
            return true;
        }
        i += 1;
    }
    false
}

/// Address ranges never dialled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressDenyList(Vec<IpNet>);

impl AddressDenyList {
    /// The probe's default ranges, in the flag's syntax: loopback and [`Self::AGENT_LOCAL`].
    pub const DEFAULT: &str =
        "127.0.0.0/8,::1/128,169.254.0.0/16,fe80::/10,fd00:ec2::254/128,100.100.100.200/32,0.0.0.0/8,::/128";

    /// An agent in a pod: the same as the probe's.
    pub const AGENT_POD: &str = Self::DEFAULT;

    /// An agent in local mode: link-local, metadata and "this host"; loopback is allowed.
    pub const AGENT_LOCAL: &str = "169.254.0.0/16,fe80::/10,fd00:ec2::254/128,100.100.100.200/32,0.0.0.0/8,::/128";

    /// No range: every address may be dialled.
    pub const fn none() -> Self {
        AddressDenyList(Vec::new())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` is in a denied range. An IPv4 address written as IPv6 (`::ffff:127.0.0.1`)
    /// is checked as the IPv4 address it dials.
    pub fn denies(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|range| range.contains(&ip))
    }

    /// Whether `url` names a denied address literally (a name is checked when it is resolved).
    pub(crate) fn denies_literal(&self, url: &str) -> bool {
        literal_ip(url).is_some_and(|ip| self.denies(ip))
    }

    /// A resolver that drops denied addresses, failing with `message` when none is left.
    pub(crate) fn resolver(&self, message: &'static str) -> Arc<DenyingResolver> {
        Arc::new(DenyingResolver { deny: self.clone(), denied: None, message })
    }

    /// `builder` dialling under this list: its resolver, and no proxy while the list is not empty.
    pub(crate) fn apply(&self, builder: reqwest::ClientBuilder, message: &'static str) -> reqwest::ClientBuilder {
        let builder = builder.dns_resolver(self.resolver(message));
        if self.is_empty() { builder } else { builder.no_proxy() }
    }
}

/// The flag's syntax back: comma-separated CIDRs.
impl std::fmt::Display for AddressDenyList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, range) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{range}")?;
        }
        Ok(())
    }
}

impl Default for AddressDenyList {
    fn default() -> Self {
        AddressDenyList::from_str(Self::DEFAULT).unwrap_or_else(|_| AddressDenyList::none())
    }
}

/// A deny-list entry that is not an address range.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "'{entry}' is not an address range; write CIDRs separated by commas (for example {default}), \
     or an empty value to allow every address",
    default = AddressDenyList::DEFAULT
)]
pub struct DenyListError {
    entry: String,
}

impl FromStr for AddressDenyList {
    type Err = DenyListError;

    /// Comma-separated CIDRs (`10.0.0.0/8`) or single addresses; empty entries are skipped, so
    /// an empty text is the empty list.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map(|net| net.trunc())
                    .map_err(|_| DenyListError { entry: entry.to_string() })
            })
            .collect::<Result<_, _>>()
            .map(AddressDenyList)
    }
}

/// The IP address a URL's host is written as, if it is one (`http://[::1]/`, `http://10.0.0.1/`):
/// such a URL is dialled without a lookup, so it is checked before connecting.
pub(crate) fn literal_ip(url: &str) -> Option<IpAddr> {
    match url::Url::parse(url).ok()?.host()? {
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        url::Host::Domain(_) => None,
    }
}

/// The system resolver (`getaddrinfo`) with denied addresses removed. When every address of a
/// name is denied the lookup fails with `message` (which names neither the address nor the
/// range: who wrote the URL need not learn where names resolve) and `denied` is set, so a caller
/// can tell without parsing the HTTP client's error text.
pub(crate) struct DenyingResolver {
    deny: AddressDenyList,
    denied: Option<Arc<AtomicBool>>,
    message: &'static str,
}

impl DenyingResolver {
    /// A resolver that also sets `denied` when it refuses a name.
    pub(crate) fn flagging(deny: AddressDenyList, denied: Arc<AtomicBool>, message: &'static str) -> Self {
        DenyingResolver { deny, denied: Some(denied), message }
    }
}

impl reqwest::dns::Resolve for DenyingResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let deny = self.deny.clone();
        let denied = self.denied.clone();
        let message = self.message;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = found.iter().copied().filter(|a| !deny.denies(a.ip())).collect();
            if allowed.is_empty() && !found.is_empty() {
                if let Some(denied) = denied {
                    denied.store(true, Ordering::Release);
                }
                return Err(message.into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn the_agents_defaults_deny_metadata_everywhere_and_loopback_only_in_a_pod() {
        let pod: AddressDenyList = AddressDenyList::AGENT_POD.parse().expect("valid");
        let local: AddressDenyList = AddressDenyList::AGENT_LOCAL.parse().expect("valid");
        for denied in ["169.254.169.254", "fe80::1", "fd00:ec2::254", "100.100.100.200", "0.0.0.0", "0.1.2.3", "::"] {
            assert!(pod.denies(ip(denied)) && local.denies(ip(denied)), "{denied}");
        }
        for spelling in ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"] {
            assert!(pod.denies(ip(spelling)), "{spelling} in a pod");
            assert!(!local.denies(ip(spelling)), "{spelling} in local mode");
        }
        for allowed in ["10.0.0.1", "192.168.1.1", "2001:db8::1", "fd12::1"] {
            assert!(!pod.denies(ip(allowed)) && !local.denies(ip(allowed)), "{allowed}");
        }
    }

    #[test]
    fn the_list_reads_back_as_it_was_written() {
        let list: AddressDenyList = AddressDenyList::AGENT_POD.parse().expect("valid");
        assert_eq!(list.to_string(), AddressDenyList::AGENT_POD);
        assert_eq!(list.to_string().parse::<AddressDenyList>().expect("valid"), list);
        assert_eq!(AddressDenyList::none().to_string(), "");
    }

    #[test]
    fn literal_urls_are_checked_in_every_spelling() {
        let pod: AddressDenyList = AddressDenyList::AGENT_POD.parse().expect("valid");
        for url in [
            "http://127.0.0.1:80/mcp",
            "http://2130706433/mcp",
            "http://0x7f.1/mcp",
            "http://[::ffff:127.0.0.1]/mcp",
            "http://[::ffff:a9fe:a9fe]/latest",
            "http://0/",
        ] {
            assert!(pod.denies_literal(url), "{url}");
        }
        assert!(!pod.denies_literal("http://localhost:8080/mcp"), "names are left to the resolver");
        assert!(!pod.denies_literal("http://10.0.0.1/mcp"));
    }

    #[tokio::test]
    async fn a_name_resolving_only_into_a_denied_range_is_never_dialled() {
        use reqwest::dns::Resolve as _;
        let pod: AddressDenyList = AddressDenyList::AGENT_POD.parse().expect("valid");
        let resolver = pod.resolver("refused by the deny list");
        let name = "localhost".parse::<reqwest::dns::Name>().expect("a name");
        let error = resolver.resolve(name).await.err().expect("every address of localhost is loopback");
        assert_eq!(error.to_string(), "refused by the deny list");
        let local: AddressDenyList = AddressDenyList::AGENT_LOCAL.parse().expect("valid");
        let name = "localhost".parse::<reqwest::dns::Name>().expect("a name");
        let addrs: Vec<SocketAddr> = local.resolver("x").resolve(name).await.expect("allowed").collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()) && !addrs.is_empty());
    }
}
