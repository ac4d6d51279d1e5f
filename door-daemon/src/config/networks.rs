//! CIDR lists: `trusted_proxies`, `allow`, `deny` and the shield's `xdp.allow` and `xdp.deny`.

use ipnet::IpNet;

use super::{ConfigError, invalid};
use crate::client::key::TrustedProxies;

/// Parses a CIDR list for `key` (each entry may itself be comma-separated; a bare address is a
/// /32 or /128) with [`TrustedProxies::parse_list`]'s checks: a /0 or host bits set are errors;
/// so are an empty entry or element ([`refuse_empty`]) and entries that together cover a whole
/// address family ([`refuse_whole_family`]).
pub(super) fn parse_cidrs(key: &str, raw: &[String]) -> Result<TrustedProxies, ConfigError> {
    refuse_empty(key, raw)?;
    let list = TrustedProxies::parse_list(&raw.join(",")).map_err(|e| cidr_error(key, &e))?;
    refuse_whole_family(
        key,
        list.nets(),
        " (as trusted proxies, any client could choose its own key)",
    )?;
    Ok(list)
}

/// A CIDR list's [`crate::client::key::KeyError`] for `key`, naming the offending element.
fn cidr_error(key: &str, e: &crate::client::key::KeyError) -> ConfigError {
    let value = match e {
        crate::client::key::KeyError::BadCidr { value }
        | crate::client::key::KeyError::ZeroPrefix { value }
        | crate::client::key::KeyError::HostBitsSet { value, .. }
        | crate::client::key::KeyError::BadSource { value } => value.clone(),
    };
    invalid(key, format!("{value:?}"), e.to_string())
}

/// Refuses an empty or blank entry of a CIDR list (`["192.0.2.10", ""]`, `--allow 192.0.2.10,,`)
/// or an empty element of one (`"192.0.2.10,"`), naming its position:
/// [`TrustedProxies::parse_list`] skips them, and one is a stray comma or a value that expanded
/// to nothing. A list that is one blank value and nothing else (`DOOR_TRUSTED_PROXIES=`,
/// `--trusted-proxy ""`) is the empty list: how a flag or a variable empties the file's list.
fn refuse_empty(key: &str, raw: &[String]) -> Result<(), ConfigError> {
    // Blank as the list parser trims: spaces and tabs.
    let blank = |s: &str| s.trim_matches([' ', '\t']).is_empty();
    if let [only] = raw
        && blank(only)
    {
        return Ok(());
    }
    for (i, entry) in raw.iter().enumerate() {
        let reason = if blank(entry) {
            "empty: write a network or remove the entry"
        } else if entry.split(',').any(blank) {
            "an element is empty (a stray comma?): remove it"
        } else {
            continue;
        };
        return Err(invalid(format!("{key}[{i}]"), format!("{entry:?}"), reason));
    }
    Ok(())
}

/// Refuses networks that together cover every IPv4 or every IPv6 address (`0.0.0.0/1` with
/// `128.0.0.0/1`): what a /0 is refused for, written another way. `why` follows the family in
/// the message.
fn refuse_whole_family(key: &str, nets: &[IpNet], why: &str) -> Result<(), ConfigError> {
    let Some(all) = IpNet::aggregate(&nets.to_vec())
        .into_iter()
        .find(|net| net.prefix_len() == 0)
    else {
        return Ok(());
    };
    let family = if all.addr().is_ipv4() { "IPv4" } else { "IPv6" };
    let entries: Vec<String> = nets
        .iter()
        .filter(|net| net.addr().is_ipv4() == all.addr().is_ipv4())
        .map(ToString::to_string)
        .collect();
    Err(invalid(
        key,
        format!("{entries:?}"),
        format!("together these cover every {family} address{why}"),
    ))
}

/// Refuses a list (`allow`, `deny`: `(key, its networks, its [xdp] form's networks)`) and its
/// `[xdp]` form (`xdp.allow`, `xdp.deny`), which are one list at layer 7, when together they cover
/// a whole address family, as either alone is refused ([`access_list`]).
///
/// # Errors
/// [`ConfigError::Invalid`] naming both keys and the networks of the covered family.
pub(super) fn lists_together(lists: &[(&str, &[IpNet], &[IpNet])]) -> Result<(), ConfigError> {
    for &(key, nets, xdp_nets) in lists {
        if !nets.is_empty() && !xdp_nets.is_empty() {
            refuse_whole_family(
                &format!("{key} with xdp.{key}"),
                &[nets, xdp_nets].concat(),
                ": list the networks you mean",
            )?;
        }
    }
    Ok(())
}

/// `allow` or `deny`: CIDRs (IPv4-mapped forms unmapped); a `/0` is refused, it would cover
/// everyone, and so are entries that together cover a whole address family, and empty entries.
pub(super) fn access_list(key: &str, raw: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    const ASK: &str = ": list the networks you mean";
    refuse_empty(key, raw)?;
    let nets = match TrustedProxies::parse_list(&raw.join(",")) {
        Ok(list) => list.nets().to_vec(),
        Err(crate::client::key::KeyError::ZeroPrefix { value }) => {
            return Err(invalid(
                key,
                format!("{value:?}"),
                format!("a /0 covers every address{ASK}"),
            ));
        }
        Err(e) => return Err(cidr_error(key, &e)),
    };
    refuse_whole_family(key, &nets, ASK)?;
    Ok(nets)
}

/// The entries of the XDP shield's lists map (an LPM trie of [`door_common::EXEMPT_CAPACITY`]
/// entries) that `exempt` and `deny` take, as `crate::shield::Shield::configure` writes them:
/// one per IPv6 network, two per IPv4 network (its IPv4-mapped form, in which the program looks
/// IPv4 sources up, and its NAT64 form, `64:ff9b::/96`), a network on both lists once, and one
/// more when an IPv6 network covers every IPv4-mapped address
/// ([`crate::client::covers_ipv4_mapped`]).
pub fn shield_list_entries(exempt: &[IpNet], deny: &[IpNet]) -> usize {
    let nets: std::collections::BTreeSet<IpNet> = exempt.iter().chain(deny).copied().collect();
    let keys: usize = nets
        .iter()
        .map(|n| if n.addr().is_ipv4() { 2 } else { 1 })
        .sum();
    keys + usize::from(nets.iter().any(crate::client::covers_ipv4_mapped))
}
