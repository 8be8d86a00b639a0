//! The two exposition formats `/metrics` answers, and which one a scraper asked for.
//!
//! Rules:
//! - [`Format::OpenMetrics`] (OpenMetrics text 1.0.0, ending in `# EOF`) where the
//!   `Accept` header asks for `application/openmetrics-text` (of no version, 1.0.0 or
//!   0.0.1, which Prometheus reads alike) ahead of any format it also takes that
//!   drivelet answers; [`Format::Text`] (the Prometheus text format 0.0.4) otherwise:
//!   no header, `text/plain`, `*/*`, anything drivelet cannot answer;
//! - "ahead" is HTTP's: each media range has its weight `q` (1 when not given, 0
//!   refuses it, an unreadable one counts as 0); the highest weight drivelet can answer
//!   wins, a tie goes to the range written first; `*/*` and `text/*` are answered with
//!   the text format, `text/plain` of another version (Prometheus 3's UTF-8
//!   `version=1.0.0`) and other types are not answered and leave the choice to the
//!   other ranges. For the headers Prometheus 2 and 3 send this is the choice of
//!   client_golang's `expfmt.NegotiateIncludingOpenMetrics`; it differs only where a
//!   wildcard weighs more than a type named after it, where HTTP says the wildcard wins.

/// An exposition format drivelet writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics text 1.0.0.
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Text,
}

impl Format {
    /// The format to answer a request whose `Accept` headers (all of them, in order,
    /// joined with commas; empty when there is none) say `accept`.
    pub fn negotiate(accept: &str) -> Format {
        let mut best: Option<(f64, Format)> = None;
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let (mut q, mut version) = (1.0_f64, None);
            for param in parts {
                let Some((key, value)) = param.split_once('=') else { continue };
                let value = value.trim().trim_matches('"');
                match key.trim().to_ascii_lowercase().as_str() {
                    "q" => q = value.parse::<f64>().ok().filter(|q| (0.0..=1.0).contains(q)).unwrap_or(0.0),
                    "version" => version = Some(value.to_string()),
                    _ => {}
                }
            }
            let answered = match (media.as_str(), version.as_deref()) {
                ("application/openmetrics-text", None | Some("1.0.0" | "0.0.1")) => Format::OpenMetrics,
                ("text/plain", None | Some("0.0.4")) | ("text/*" | "*/*", _) => Format::Text,
                _ => continue,
            };
            if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
                best = Some((q, answered));
            }
        }
        best.map_or(Format::Text, |(_, f)| f)
    }

    /// Its `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scraper_gets_the_format_its_accept_header_puts_first() {
        use Format::{OpenMetrics as Om, Text};
        let table: &[(&str, &str, Format)] = &[
            ("no header", "", Text),
            ("curl", "*/*", Text),
            ("promtool and older agents", "text/plain; version=0.0.4", Text),
            ("text/plain of no version", "text/plain", Text),
            ("OpenMetrics of no version", "application/openmetrics-text", Om),
            ("OpenMetrics 1.0.0", "application/openmetrics-text; version=1.0.0; charset=utf-8", Om),
            ("OpenMetrics 0.0.1", "application/openmetrics-text;version=0.0.1", Om),
            ("case and spaces", "  Application/OpenMetrics-Text ;  Version = 1.0.0 ", Om),
            (
                "Prometheus 2.x",
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                Om,
            ),
            (
                "Prometheus 3.x",
                "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
                Om,
            ),
            (
                "Prometheus 3.x asked for the text format first",
                "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.6,text/plain;version=0.0.4;q=0.5,application/openmetrics-text;version=1.0.0;q=0.4",
                Text,
            ),
            ("protobuf only", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", Text),
            ("protobuf first, then OpenMetrics", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,application/openmetrics-text;version=1.0.0;q=0.6,*/*;q=0.1", Om),
            ("text weighed higher", "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5", Text),
            ("a wildcard weighed higher", "*/*;q=0.9,application/openmetrics-text;q=0.5", Text),
            ("a tie goes to the first", "application/openmetrics-text;q=0.5,text/plain;q=0.5", Om),
            ("a tie goes to the first, text", "text/plain;q=0.5,application/openmetrics-text;q=0.5", Text),
            ("OpenMetrics refused", "application/openmetrics-text;q=0", Text),
            ("OpenMetrics of an unknown version", "application/openmetrics-text;version=2.0.0", Text),
            ("an unreadable weight", "application/openmetrics-text;q=high,text/plain;q=0.1", Text),
            ("a weight out of range", "application/openmetrics-text;q=7", Text),
            ("two headers joined", "text/html,application/openmetrics-text", Om),
            ("garbage", ";;,,=;q=;version", Text),
        ];
        for (who, accept, want) in table {
            assert_eq!(Format::negotiate(accept), *want, "{who}: {accept}");
        }
    }

    #[test]
    fn each_format_has_its_content_type() {
        assert_eq!(Format::OpenMetrics.content_type(), "application/openmetrics-text; version=1.0.0; charset=utf-8");
        assert_eq!(Format::Text.content_type(), "text/plain; version=0.0.4; charset=utf-8");
    }
}
