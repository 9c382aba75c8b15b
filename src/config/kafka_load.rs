//! The `serve` flags of partition weights learned from Kafka (docs/design.md §11), to be
//! flattened into the serve flags; [`KafkaLoadArgs::settings`] turns them into
//! [`KafkaLoadSettings`]. Shared with other serve flags: the brokers, librdkafka settings
//! and request timeout are `--kafka-brokers`, `--kafka-config` and `--kafka-timeout`, and
//! Kafka is read every `--weights-refresh` (the interval at which the leader asks for
//! weights: reading Kafka more often would learn nothing the leader uses).

use std::{collections::BTreeMap, time::Duration};

use crate::duration::{humantime_or_zero, parse_duration};
use crate::kafka_load::KafkaLoadSettings;

/// Flags of weights learned from Kafka.
#[derive(Clone, Debug, clap::Args)]
pub struct KafkaLoadArgs {
    /// Time constant of the produce rate's moving average: a sustained change in a
    /// partition's rate is 63 % reflected after this long (`0s`: no smoothing).
    #[arg(long, env = "KAFKA_ASSIGNER_WEIGHTS_WINDOW", value_parser = humantime_or_zero, default_value = "60s")]
    pub weights_window: Duration,

    /// The consumer group the consumers commit offsets to: its lag adds to a partition's
    /// weight. Only read, never joined or committed to.
    #[arg(long, env = "KAFKA_ASSIGNER_LAG_GROUP")]
    pub lag_group: Option<String>,

    /// A backlog weighs as the extra rate that drains it within this time.
    #[arg(long, env = "KAFKA_ASSIGNER_LAG_HORIZON", value_parser = parse_duration, default_value = "60s")]
    pub lag_horizon: Duration,

    /// Kafka broker id → rack, `1=zone-a,2=zone-b` (librdkafka does not report racks):
    /// a partition's zone is its leader's rack, for same-zone placement. Repeatable.
    #[arg(long, env = "KAFKA_ASSIGNER_BROKER_RACKS", value_name = "ID=RACK,...", value_parser = parse_broker_racks)]
    pub broker_racks: Vec<BrokerRacks>,
}

/// Broker id → rack, from one `--broker-racks` value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrokerRacks(pub BTreeMap<i32, String>);

/// Parses `1=zone-a,2=zone-b` (spaces around items allowed; an id at most once).
pub fn parse_broker_racks(text: &str) -> Result<BrokerRacks, String> {
    let mut racks = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|item| !item.is_empty()) {
        let Some((id, rack)) = item.split_once('=') else {
            return Err(format!("'{item}' is not ID=RACK (e.g. 1=zone-a)"));
        };
        let id: i32 = id.trim().parse().map_err(|_| format!("'{id}' in '{item}' is not a broker id"))?;
        let rack = rack.trim();
        if rack.is_empty() {
            return Err(format!("'{item}': the rack is empty"));
        }
        if racks.insert(id, rack.to_string()).is_some() {
            return Err(format!("broker {id} is given twice"));
        }
    }
    if racks.is_empty() {
        return Err("no ID=RACK given (e.g. 1=zone-a,2=zone-b)".into());
    }
    Ok(BrokerRacks(racks))
}

impl KafkaLoadArgs {
    /// The settings these flags ask for, Kafka read every `refresh` (`--weights-refresh`);
    /// a later `--broker-racks` wins for the same id.
    pub fn settings(&self, refresh: Duration) -> KafkaLoadSettings {
        let lag_group = self.lag_group.as_deref().map(str::trim).filter(|g| !g.is_empty()).map(String::from);
        KafkaLoadSettings {
            refresh,
            window: self.weights_window,
            lag_group,
            lag_horizon: self.lag_horizon,
            broker_racks: self.broker_racks.iter().flat_map(|r| r.0.clone()).collect(),
            statistics_interval: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::kafka_load::DEFAULT_REFRESH;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        load: KafkaLoadArgs,
    }

    fn parse(args: &[&str]) -> Result<KafkaLoadSettings, String> {
        let all = std::iter::once("test").chain(args.iter().copied());
        Flags::try_parse_from(all).map(|f| f.load.settings(DEFAULT_REFRESH)).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_the_modules() {
        // The clap defaults are literals: this keeps them equal to the module's constants.
        assert_eq!(parse(&[]), Ok(KafkaLoadSettings::default()));
    }

    #[test]
    fn every_flag() {
        let settings = parse(&[
            "--weights-window",
            "0s",
            "--lag-group",
            "orders-consumers",
            "--lag-horizon",
            "5m",
            "--broker-racks",
            "1=zone-a, 2=zone-b",
            "--broker-racks",
            "3=zone-c,2=zone-x",
        ])
        .unwrap();
        assert_eq!(settings.window, Duration::ZERO);
        assert_eq!(settings.lag_group.as_deref(), Some("orders-consumers"));
        assert_eq!(settings.lag_horizon, Duration::from_secs(300));
        let racks: Vec<(i32, &str)> = settings.broker_racks.iter().map(|(&id, r)| (id, r.as_str())).collect();
        assert_eq!(racks, vec![(1, "zone-a"), (2, "zone-x"), (3, "zone-c")]);
        assert_eq!(parse(&["--lag-group", " "]).unwrap().lag_group, None);
    }

    #[test]
    fn flattens_into_the_serve_flags_without_a_clash() {
        #[derive(Debug, Parser)]
        struct Serve {
            #[command(flatten)]
            serve: crate::config::ServeArgs,
        }
        use clap::CommandFactory;
        Serve::command().debug_assert();
        let parsed = Serve::try_parse_from(["serve", "--weights-refresh", "2s", "--lag-group", "g"]).unwrap();
        let settings = parsed.serve.kafka_load.settings(parsed.serve.weights_refresh);
        assert_eq!((settings.refresh, settings.lag_group.as_deref()), (Duration::from_secs(2), Some("g")));
    }

    #[test]
    fn bad_values_name_their_flag() {
        for (flag, value) in [
            ("--weights-window", "soon"),
            ("--lag-horizon", "0s"),
            ("--broker-racks", "1:zone-a"),
            ("--broker-racks", "x=zone-a"),
            ("--broker-racks", "1="),
            ("--broker-racks", "1=a,1=b"),
            ("--broker-racks", ","),
        ] {
            let error = parse(&[flag, value]).unwrap_err();
            assert!(error.contains(flag), "{flag} {value}: {error}");
        }
    }
}
