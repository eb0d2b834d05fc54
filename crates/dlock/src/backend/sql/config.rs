//! URLs of the SQL stores: `postgres://…`, `postgresql://…`, `mysql://…`, `mariadb://…`.

use crate::error::{Error, Result};
use url::Url;

/// The SQL flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL or MariaDB (InnoDB).
    MySql,
}

impl Dialect {
    /// `postgres` or `mysql`: the backend's short name.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
        }
    }

    /// The database clock in milliseconds since the Unix epoch, as a BIGINT expression.
    pub(super) fn now_ms(self) -> &'static str {
        match self {
            Dialect::Postgres => "floor(extract(epoch from clock_timestamp()) * 1000)::bigint",
            Dialect::MySql => "CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) AS SIGNED)",
        }
    }

    /// Rewrites `?` placeholders to the dialect's (`$1, $2, …` on PostgreSQL).
    pub(super) fn sql(self, s: &str) -> String {
        match self {
            Dialect::MySql => s.to_string(),
            Dialect::Postgres => {
                let mut out = String::with_capacity(s.len() + 8);
                let mut n = 0;
                for c in s.chars() {
                    if c == '?' {
                        n += 1;
                        out.push('$');
                        out.push_str(&n.to_string());
                    } else {
                        out.push(c);
                    }
                }
                out
            }
        }
    }
}

/// The default table name (URL option `table`).
pub const DEFAULT_TABLE: &str = "dlock_locks";

/// The longest table name accepted: the derived names (`<table>_queue`, `<table>_fences`,
/// `<table>_meta`, index names) must stay within the 63/64-character identifier limits.
pub const MAX_TABLE_LEN: usize = 41;

/// Options passed on to the database driver unchanged (TLS and the application name).
const PG_PASSTHROUGH: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
];
const MYSQL_PASSTHROUGH: &[&str] = &["ssl-mode", "ssl-ca", "ssl-cert", "ssl-key"];

/// How holds are kept (URL option `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldMode {
    /// Rows in the lease table, renewed by the client (the default).
    Lease,
    /// Server-side session locks (PostgreSQL advisory locks, MySQL `GET_LOCK`), one dedicated
    /// connection per hold.
    Session,
}

/// A parsed SQL store URL.
#[derive(Clone, PartialEq, Eq)]
pub struct SqlConfig {
    pub(crate) dialect: Dialect,
    /// The URL handed to the driver: our own options removed, `mariadb:` spelled `mysql:`.
    pub(crate) driver_url: String,
    /// The URL with the password redacted, for messages.
    pub(crate) shown: String,
    pub(crate) table: String,
    pub(crate) mode: HoldMode,
}

impl std::fmt::Debug for SqlConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlConfig")
            .field("dialect", &self.dialect)
            .field("url", &self.shown)
            .field("table", &self.table)
            .field("mode", &self.mode)
            .finish()
    }
}

/// Checks a table name: `[A-Za-z_][A-Za-z0-9_]{0,40}`. Names are never quoted, so anything else
/// (quotes, spaces, semicolons) is refused rather than escaped.
pub fn validate_table(t: &str) -> Result<()> {
    let mut chars = t.chars();
    let ok = match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {
            t.len() <= MAX_TABLE_LEN && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidConfig(format!(
            "table name {} is not an identifier of 1 to {MAX_TABLE_LEN} characters \
             [A-Za-z_][A-Za-z0-9_]*",
            crate::url::clip(t)
        )))
    }
}

impl SqlConfig {
    /// Parses a `postgres://`, `postgresql://`, `mysql://` or `mariadb://` URL.
    ///
    /// Options: `table` (default [`DEFAULT_TABLE`]), `mode` (`lease`, the default, or `session`),
    /// and the driver's TLS options (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`,
    /// `application_name` for PostgreSQL; `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key` for MySQL).
    /// Anything else is [`Error::InvalidConfig`].
    pub fn parse(raw: &str) -> Result<SqlConfig> {
        let shown = crate::url::redact_url(raw);
        let mut u = Url::parse(raw)
            .map_err(|e| Error::InvalidConfig(format!("malformed store URL {shown}: {e}")))?;
        let dialect = match u.scheme() {
            "postgres" | "postgresql" => Dialect::Postgres,
            "mysql" | "mariadb" => Dialect::MySql,
            s => {
                return Err(Error::InvalidConfig(format!(
                    "{s:?} is not a SQL store scheme"
                )))
            }
        };
        if u.host_str().map_or(true, str::is_empty) {
            return Err(Error::InvalidConfig(format!(
                "{shown} names no host (example: {}://user@127.0.0.1/db)",
                u.scheme()
            )));
        }
        let passthrough = match dialect {
            Dialect::Postgres => PG_PASSTHROUGH,
            Dialect::MySql => MYSQL_PASSTHROUGH,
        };
        let mut table = DEFAULT_TABLE.to_string();
        let mut mode = HoldMode::Lease;
        let mut keep: Vec<(String, String)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (k, v) in u.query_pairs() {
            if !seen.insert(k.to_string()) {
                return Err(Error::InvalidConfig(format!(
                    "option {} is given twice in {shown}",
                    crate::url::clip(&k)
                )));
            }
            match &*k {
                "table" => {
                    validate_table(&v)?;
                    table = v.into_owned();
                }
                "mode" => {
                    mode = match &*v {
                        "lease" => HoldMode::Lease,
                        "session" => HoldMode::Session,
                        other => {
                            return Err(Error::InvalidConfig(format!(
                                "mode must be \"lease\" or \"session\", not {}",
                                crate::url::clip(other)
                            )))
                        }
                    }
                }
                k if passthrough.contains(&k) => keep.push((k.to_string(), v.into_owned())),
                k => {
                    return Err(Error::InvalidConfig(format!(
                        "unknown option {} in {} URL (known: table, mode, {})",
                        crate::url::clip(k),
                        dialect.name(),
                        passthrough.join(", ")
                    )))
                }
            }
        }
        if keep.is_empty() {
            u.set_query(None);
        } else {
            u.query_pairs_mut().clear().extend_pairs(keep);
        }
        let mut driver_url = u.to_string();
        if let Some(rest) = driver_url.strip_prefix("mariadb:") {
            driver_url = format!("mysql:{rest}");
        }
        Ok(SqlConfig {
            dialect,
            driver_url,
            shown,
            table,
            mode,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options() {
        let c = SqlConfig::parse("postgres://u:pw@h:5432/db?table=my_locks&mode=session").unwrap();
        assert_eq!(c.dialect, Dialect::Postgres);
        assert_eq!(c.table, "my_locks");
        assert_eq!(c.mode, HoldMode::Session);
        assert_eq!(c.driver_url, "postgres://u:pw@h:5432/db");
        assert!(!format!("{c:?}").contains("pw"));
        let c = SqlConfig::parse("mariadb://root@h/test?ssl-mode=disabled").unwrap();
        assert_eq!(c.dialect, Dialect::MySql);
        assert_eq!(c.table, DEFAULT_TABLE);
        assert_eq!(c.mode, HoldMode::Lease);
        assert_eq!(c.driver_url, "mysql://root@h/test?ssl-mode=disabled");
        for bad in [
            "postgres://h/db?table=x;%20DROP%20TABLE%20y",
            "postgres://h/db?table=x%3B%20DROP%20TABLE%20y",
            "mysql://h/db?table=1abc",
            "mysql://h/db?table=",
            "mysql://h/db?table=a-b",
            "mysql://h/db?table=%22quoted%22",
            "postgres://h/db?mode=forever",
            "postgres://h/db?bogus=1",
            "postgres://h/db?ssl-mode=disabled",
            "mysql://h/db?table=a&table=b",
            "postgres:///db",
        ] {
            let e = SqlConfig::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
        }
        assert!(validate_table(&"a".repeat(41)).is_ok());
        assert!(validate_table(&"a".repeat(42)).is_err());
        assert!(validate_table("_x9").is_ok());
        assert!(validate_table("x; DROP TABLE y").is_err());
    }
}
