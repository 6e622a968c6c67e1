//! The tier: which of the daemon's three models a task runs on. Defined
//! once, here, because both sides of the wire name it: the daemon's config
//! and registry, and the client's CLI, GUI, dispatcher and task policies.
//! On the wire it is the string `tier1`..`tier3` (an empty string means the
//! default tier), so older callers and other languages keep working.

use std::fmt;
use std::str::FromStr;

/// One of the three tiers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Small and fast: checks, gates, short background jobs.
    Tier1,
    /// Conversational: the chat's answers. The default.
    #[default]
    Tier2,
    /// Heavy: long or hard tasks.
    Tier3,
}

impl Tier {
    /// Every tier, in order.
    pub const ALL: [Tier; 3] = [Tier::Tier1, Tier::Tier2, Tier::Tier3];
    /// The tier of a request that names none.
    pub const DEFAULT: Tier = Tier::Tier2;

    /// Its name, as written in configs, on the command line and on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::Tier1 => "tier1",
            Tier::Tier2 => "tier2",
            Tier::Tier3 => "tier3",
        }
    }

    /// The tier a wire field names; an empty field is the default tier.
    pub fn from_wire(s: &str) -> Result<Tier, UnknownTier> {
        if s.is_empty() { Ok(Tier::DEFAULT) } else { s.parse() }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tier equals its name (`Tier::Tier1 == "tier1"`).
impl PartialEq<str> for Tier {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Tier {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A name that is not a tier. Its text names the tiers there are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownTier(pub String);

impl fmt::Display for UnknownTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a tier; the tiers are tier1, tier2 and tier3", self.0)
    }
}

impl std::error::Error for UnknownTier {}

impl FromStr for Tier {
    type Err = UnknownTier;

    fn from_str(s: &str) -> Result<Tier, UnknownTier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == s).ok_or_else(|| UnknownTier(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_default_is_tier2() {
        for t in Tier::ALL {
            assert_eq!(t.as_str().parse::<Tier>(), Ok(t));
            assert_eq!(t.to_string(), t.as_str());
        }
        assert_eq!(Tier::from_wire(""), Ok(Tier::Tier2));
        assert_eq!(Tier::default(), Tier::DEFAULT);
        let e = "tier4".parse::<Tier>().unwrap_err();
        assert_eq!(e.to_string(), "\"tier4\" is not a tier; the tiers are tier1, tier2 and tier3");
        assert!("Tier1".parse::<Tier>().is_err(), "names are exact");
    }
}
