//! A tier's ensemble, as the user sets it (`revis ensemble`, the GUI's
//! Tiers view), kept in the store as JSON like a tier's offload.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::api::Tier;

/// How the members' answers are combined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Method {
    /// Each member drafts the next span; the span its own model is surest of
    /// (highest log-probability per byte) wins. The default: the cheapest
    /// (one call per member a round, in parallel), and never below the
    /// better member in docs/ENSEMBLE.md's runs.
    #[default]
    Confident,
    /// Each member drafts; every member scores every draft; the draft with
    /// the highest weighted sum of per-byte log-probabilities wins, and the
    /// weights follow how often each member's drafts win.
    Cross,
    /// The first member drafts; only where it is unsure, the members'
    /// probabilities of the candidate next words are mixed (by text) and the
    /// likeliest word continues.
    Merge,
}

impl Method {
    pub const ALL: [Method; 3] = [Method::Confident, Method::Cross, Method::Merge];

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Confident => "confident",
            Method::Cross => "cross",
            Method::Merge => "merge",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Method {
    type Err = String;

    fn from_str(s: &str) -> Result<Method, String> {
        Method::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown ensemble method {s:?}: use confident, cross or merge"))
    }
}

/// One model of an ensemble: a tier of this machine's daemon, or of a paired node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MemberSpec {
    /// A paired node's name or device ID; None = this machine.
    pub node: Option<String>,
    pub tier: Tier,
}

impl fmt::Display for MemberSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(node) => write!(f, "{node}/{}", self.tier),
            None => write!(f, "{}", self.tier),
        }
    }
}

impl FromStr for MemberSpec {
    type Err = String;

    /// `tier2` (this machine) or `NODE/tier3` (a paired node's tier).
    fn from_str(s: &str) -> Result<MemberSpec, String> {
        let s = s.trim();
        let (node, tier) = match s.rsplit_once('/') {
            Some((node, tier)) if !node.trim().is_empty() => (Some(node.trim().to_owned()), tier),
            Some(_) => return Err(format!("ensemble member {s:?} names no node before the '/': write NODE/TIER or just TIER")),
            None => (None, s),
        };
        let tier = tier.parse::<Tier>().map_err(|e| format!("ensemble member {s:?}: {e}"))?;
        Ok(MemberSpec { node, tier })
    }
}

/// A member that cannot answer as the settings name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberProblem {
    /// Its node is not paired with this machine.
    NotPaired(MemberSpec),
    /// Its tier is not one this machine's revisd serves.
    NotServedHere { member: MemberSpec, served: Vec<Tier> },
}

impl fmt::Display for MemberProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemberProblem::NotPaired(m) => {
                write!(f, "ensemble member {m}: no paired node is called or has the ID {:?}", m.node.as_deref().unwrap_or_default())
            }
            MemberProblem::NotServedHere { member, served } => {
                let served: Vec<&str> = served.iter().map(|t| t.as_str()).collect();
                write!(f, "ensemble member {member}: this machine's revisd serves no {} (it serves {})", member.tier, served.join(", "))
            }
        }
    }
}

/// The first member that cannot answer: one on a node that `paired` does
/// not know, or one here whose tier is not in `served_here` (the tiers this
/// machine's revisd serves; only asked for when a member is here).
pub fn check_members(
    members: &[MemberSpec],
    mut paired: impl FnMut(&str) -> bool,
    served_here: impl FnOnce() -> Vec<Tier>,
) -> Result<(), MemberProblem> {
    if let Some(m) = members.iter().find(|m| m.node.as_deref().is_some_and(|n| !paired(n))) {
        return Err(MemberProblem::NotPaired(m.clone()));
    }
    if members.iter().any(|m| m.node.is_none()) {
        let served = served_here();
        if let Some(m) = members.iter().find(|m| m.node.is_none() && !served.contains(&m.tier)) {
            return Err(MemberProblem::NotServedHere { member: m.clone(), served });
        }
    }
    Ok(())
}

/// At most this many members: every round waits for all of them.
pub const MAX_MEMBERS: usize = 4;
/// Span lengths a round may draft, in tokens.
pub const SPAN_TOKENS: std::ops::RangeInclusive<u32> = 1..=64;

/// A tier's ensemble.
#[derive(Clone, Debug, PartialEq)]
pub struct EnsembleSpec {
    pub enabled: bool,
    pub members: Vec<MemberSpec>,
    pub method: Method,
    /// Tokens each member drafts per round (K), cut back to a word boundary.
    pub span_tokens: u32,
    /// `merge`: the first member's top token probability under which the
    /// members' distributions are mixed.
    pub gate: f32,
    /// A member that has not answered a round within this sits it out.
    pub round_deadline: Duration,
}

impl Default for EnsembleSpec {
    fn default() -> Self {
        EnsembleSpec {
            enabled: false,
            members: Vec::new(),
            method: Method::default(),
            span_tokens: 16,
            gate: 0.5,
            round_deadline: Duration::from_secs(10),
        }
    }
}

impl EnsembleSpec {
    /// Says what is wrong with these settings, in words a person can act on.
    pub fn check(&self) -> Result<(), String> {
        if self.enabled && self.members.len() < 2 {
            return Err(format!("an ensemble needs at least two members, it has {}", self.members.len()));
        }
        if self.members.len() > MAX_MEMBERS {
            return Err(format!("an ensemble has at most {MAX_MEMBERS} members, not {}", self.members.len()));
        }
        if let Some(dup) = self.members.iter().enumerate().find(|(i, m)| self.members[..*i].contains(m)) {
            return Err(format!("ensemble member {} is listed twice", dup.1));
        }
        if !SPAN_TOKENS.contains(&self.span_tokens) {
            return Err(format!(
                "the span is {} tokens: it must be between {} and {}",
                self.span_tokens,
                SPAN_TOKENS.start(),
                SPAN_TOKENS.end()
            ));
        }
        if !(self.gate > 0.0 && self.gate <= 1.0) {
            return Err(format!("the merge gate is {}: it must be above 0 and at most 1", self.gate));
        }
        if self.round_deadline.is_zero() || self.round_deadline > Duration::from_secs(600) {
            return Err(format!("the round deadline is {:?}: it must be between 1 ms and 600 s", self.round_deadline));
        }
        Ok(())
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "enabled": self.enabled,
            "members": self.members.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
            "method": self.method.as_str(),
            "span_tokens": self.span_tokens,
            "gate": self.gate,
            "round_deadline_ms": self.round_deadline.as_millis() as u64,
        })
    }

    /// Reads settings written by [`EnsembleSpec::to_json`]; what is missing
    /// or unreadable takes its default, and settings that do not pass
    /// [`EnsembleSpec::check`] come back disabled.
    pub fn from_json(v: &serde_json::Value) -> EnsembleSpec {
        let d = EnsembleSpec::default();
        let mut spec = EnsembleSpec {
            enabled: v["enabled"].as_bool().unwrap_or(false),
            members: v["members"].as_array().map_or_else(Vec::new, |a| a.iter().filter_map(|m| m.as_str()?.parse().ok()).collect()),
            method: v["method"].as_str().and_then(|m| m.parse().ok()).unwrap_or(d.method),
            span_tokens: v["span_tokens"].as_u64().map_or(d.span_tokens, |n| n.min(u64::from(u32::MAX)) as u32),
            gate: v["gate"].as_f64().map_or(d.gate, |g| g as f32),
            round_deadline: v["round_deadline_ms"].as_u64().map_or(d.round_deadline, Duration::from_millis),
        };
        if spec.check().is_err() {
            spec.enabled = false;
        }
        spec
    }

    /// One line for `revis status`.
    pub fn describe(&self) -> String {
        let members = self.members.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(" + ");
        let state = if self.enabled { "on" } else { "off" };
        format!("{state}: {members} ({}, spans of {} tokens)", self.method, self.span_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_parse_with_and_without_a_node() {
        assert_eq!("tier2".parse::<MemberSpec>().unwrap(), MemberSpec { node: None, tier: Tier::Tier2 });
        assert_eq!("desk top/tier3".parse::<MemberSpec>().unwrap(), MemberSpec { node: Some("desk top".into()), tier: Tier::Tier3 });
        assert!("/tier3".parse::<MemberSpec>().unwrap_err().contains("names no node"));
        assert!("desktop/tier9".parse::<MemberSpec>().unwrap_err().contains("tier9"));
    }

    #[test]
    fn members_that_cannot_answer_are_named() {
        let members: Vec<MemberSpec> = ["tier2", "desk/tier3"].iter().map(|m| m.parse().unwrap()).collect();
        assert_eq!(check_members(&members, |n| n == "desk", || vec![Tier::Tier1, Tier::Tier2]), Ok(()));
        let e = check_members(&members, |_| false, || unreachable!("a node is checked first")).unwrap_err();
        assert_eq!(e.to_string(), "ensemble member desk/tier3: no paired node is called or has the ID \"desk\"");
        let e = check_members(&members, |_| true, || vec![Tier::Tier1, Tier::Tier3]).unwrap_err();
        assert_eq!(e.to_string(), "ensemble member tier2: this machine's revisd serves no tier2 (it serves tier1, tier3)");
        // Members all on nodes: this machine's daemon is not asked.
        let remote: Vec<MemberSpec> = ["a/tier1", "b/tier1"].iter().map(|m| m.parse().unwrap()).collect();
        assert_eq!(check_members(&remote, |_| true, || panic!("not asked")), Ok(()));
    }

    #[test]
    fn settings_round_trip_through_json() {
        let spec = EnsembleSpec {
            enabled: true,
            members: vec!["tier2".parse().unwrap(), "desktop/tier1".parse().unwrap()],
            method: Method::Merge,
            span_tokens: 8,
            gate: 0.3,
            round_deadline: Duration::from_millis(2500),
        };
        assert_eq!(EnsembleSpec::from_json(&spec.to_json()), spec);
    }

    #[test]
    fn bad_settings_are_named_and_never_enabled() {
        let one = EnsembleSpec { enabled: true, members: vec!["tier2".parse().unwrap()], ..Default::default() };
        assert!(one.check().unwrap_err().contains("at least two members"));
        assert!(!EnsembleSpec::from_json(&one.to_json()).enabled);
        let twice = EnsembleSpec { members: vec!["tier2".parse().unwrap(), "tier2".parse().unwrap()], ..Default::default() };
        assert!(twice.check().unwrap_err().contains("listed twice"));
        let long = EnsembleSpec { span_tokens: 65, ..Default::default() };
        assert!(long.check().unwrap_err().contains("between 1 and 64"));
        let gate = EnsembleSpec { gate: 0.0, ..Default::default() };
        assert!(gate.check().unwrap_err().contains("merge gate"));
        assert_eq!("CROSS".parse::<Method>(), Ok(Method::Cross));
        assert!("vote".parse::<Method>().unwrap_err().contains("confident, cross or merge"));
    }
}
