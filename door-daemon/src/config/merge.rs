//! The flags written over the file's tables before either is checked, so that a flag's value is
//! checked by the file's code and its error names the file's key.

use super::{
    ConfigError,
    file::{File, PlaneFile, XdpFile},
    flags::Overrides,
    invalid,
};

/// Writes the flags of `[xdp]` (but `interface` and `mode`, read by [`build_xdp`]), `[plane.*]`,
/// `[group.NAME]` and `[[route]]` into the file's values, as if the file gave them, so that they
/// are checked by the same code and their errors name the same keys: a flag of a table the file
/// lacks creates it (an `--xdp-*` flag turns the shield on as an `[xdp]` section does; a
/// `--plane-*` flag writes `[plane.session]` or `[plane.ip]`); `--plane-session-cookie` or
/// `--plane-session-header` replaces the file's credential (both keys: they are one choice);
/// each `--group` item sets one key of its group; `--route` replaces the file's whole list.
///
/// [`build_xdp`]: super::xdp::build_xdp
pub(super) fn written_over(file: &mut File, o: &Overrides) -> Result<(), ConfigError> {
    written_over_xdp(&mut file.xdp, o)?;
    written_over_planes(&mut file.plane, o);
    // One blank item alone is `DOOR_GROUP=` (set, empty): nothing to set. A blank item beside
    // others is a stray comma (`--group link.rate=2,`), refused as in the CIDR lists.
    if o.group.len() > 1
        && let Some(i) = o.group.iter().position(|item| item.name.is_empty())
    {
        return Err(invalid(
            format!("--group / DOOR_GROUP[{i}]"),
            "\"\"",
            "empty (a stray comma?): remove it",
        ));
    }
    for item in o.group.iter().filter(|item| !item.name.is_empty()) {
        item.write_into(file.group.entry(item.name.clone()).or_default());
    }
    if let Some(lists) = &o.routes {
        file.route = lists.iter().flat_map(|l| l.0.iter().cloned()).collect();
    }
    Ok(())
}

/// Whether a list flag's values are one blank value: the empty list (`DOOR_XDP_ALLOW=`).
fn is_blank(values: &[String]) -> bool {
    matches!(values, [only] if only.trim().is_empty())
}

/// [`put`] for a list: an empty list (one blank value) is written but does not count as a flag
/// given, so `DOOR_XDP_ALLOW=` empties the file's list without turning the shield on.
fn put_list(slot: &mut Option<Vec<String>>, flag: Option<&Vec<String>>, given: &mut bool) {
    if let Some(values) = flag {
        *slot = Some(values.clone());
        *given |= !is_blank(values);
    }
}

/// [`put`] for each `slot => flag` (an `Option` field of [`Overrides`]), noting in `given`.
macro_rules! put_all {
    ($given:ident; $($slot:expr => $flag:expr),* $(,)?) => {
        $( put(&mut $slot, $flag.as_ref(), &mut $given); )*
    };
}

/// `slot` = `flag` when given; notes that a flag was given.
fn put<T: Clone>(slot: &mut Option<T>, flag: Option<&T>, given: &mut bool) {
    if let Some(v) = flag {
        *slot = Some(v.clone());
        *given = true;
    }
}

/// The `--xdp-*` flags (but `interface` and `mode`) written into `[xdp]`, creating it.
fn written_over_xdp(xdp: &mut Option<XdpFile>, o: &Overrides) -> Result<(), ConfigError> {
    let mut given = xdp.is_some();
    let mut x = xdp.take().unwrap_or_default();
    put_all!(given;
        x.syn_rate => o.xdp_syn_rate,
        x.syn_burst => o.xdp_syn_burst,
    );
    if let Some(ports) = &o.xdp_ports {
        x.ports = Some(flag_ports(ports)?);
        given |= !is_blank(ports);
    }
    put_all!(given;
        x.new_prefix_rate => o.xdp_new_prefix_rate,
        x.new_prefix_burst => o.xdp_new_prefix_burst,
        x.overflow_syn_rate => o.xdp_overflow_syn_rate,
        x.overflow_syn_burst => o.xdp_overflow_syn_burst,
        x.max_prefixes => o.xdp_max_prefixes,
    );
    put_list(&mut x.allow, o.xdp_allow.as_ref(), &mut given);
    put_list(&mut x.deny, o.xdp_deny.as_ref(), &mut given);
    put_all!(given;
        x.escalate_after => o.xdp_escalate_after,
        x.escalate_window => o.xdp_escalate_window,
        x.block_for => o.xdp_block_for,
        x.syn_cookies => o.xdp_syn_cookies,
        x.cookie_threshold => o.xdp_cookie_threshold,
    );
    if given {
        *xdp = Some(x);
    }
    Ok(())
}

/// The `--plane-*` flags written into `[plane.session]` and `[plane.ip]`, creating them.
fn written_over_planes(plane: &mut Option<PlaneFile>, o: &Overrides) {
    let had_plane = plane.is_some();
    let mut p = plane.take().unwrap_or_default();
    let mut session_given = p.session.is_some();
    let mut session = p.session.take().unwrap_or_default();
    if o.plane_session_cookie.is_some() || o.plane_session_header.is_some() {
        session.cookie.clone_from(&o.plane_session_cookie);
        session.header.clone_from(&o.plane_session_header);
        session_given = true;
    }
    put_all!(session_given;
        session.rate => o.plane_session_rate,
        session.burst => o.plane_session_burst,
        session.max_clients => o.plane_session_max_clients,
    );
    p.session = session_given.then_some(session);
    let mut ip_given = p.ip.is_some();
    let mut ip = p.ip.take().unwrap_or_default();
    put_all!(ip_given;
        ip.rate => o.plane_ip_rate,
        ip.burst => o.plane_ip_burst,
        ip.max_clients => o.plane_ip_max_clients,
    );
    p.ip = ip_given.then_some(ip);
    if had_plane || p.session.is_some() || p.ip.is_some() {
        *plane = Some(p);
    }
}

/// `--xdp-ports` / `DOOR_XDP_PORTS` as the file's `ports`: each element a whole number (its range
/// is checked as the file's is, naming `xdp.ports[i]`); one blank value alone is `[]` (every
/// port), as for the other list flags.
fn flag_ports(raw: &[String]) -> Result<Vec<i64>, ConfigError> {
    if is_blank(raw) {
        return Ok(Vec::new());
    }
    raw.iter()
        .enumerate()
        .map(|(i, p)| {
            p.trim().parse::<i64>().map_err(|_| {
                invalid(
                    format!("xdp.ports[{i}]"),
                    format!("{p:?}"),
                    "not a TCP port (1-65535)",
                )
            })
        })
        .collect()
}
