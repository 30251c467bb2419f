//! Small pieces every binary of the platform shares on its command line: durations
//! (`90s`, `5m`, `12h`, `30d`) and the log format.

use std::time::Duration;

/// Parse `90s`, `5m`, `12h`, `30d` or plain seconds; zero is refused (a zero interval
/// would spin).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86_400),
        _ => return Err(format!("invalid duration unit in {s:?} (use s, m, h or d)")),
    }
    .ok_or_else(|| format!("duration {s:?} is too long"))?;
    if secs == 0 {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(Duration::from_secs(secs))
}

pub use crate::process::{LogFormat, init_logging};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration(" 5m "), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(2_592_000)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5w").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}
