//! Durations given on the command line or in the environment (`500ms`, `10s`, `5m`).

use std::time::Duration;

/// Parses `500ms`, `10s`, `5m`, `1h` (humantime syntax); zero is refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("'{text}' is not a duration ({e}); use e.g. 500ms, 10s, 5m"))?;
    if d.is_zero() {
        return Err(format!("'{text}' must be greater than zero"));
    }
    Ok(d)
}

/// Parses a duration like [`parse_duration`], where zero is allowed (`0s`: off).
pub fn humantime_or_zero(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("'{text}' is not a duration ({e}); use e.g. 0s, 300ms, 1s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("ten").unwrap_err().contains("'ten' is not a duration"));
    }
}
