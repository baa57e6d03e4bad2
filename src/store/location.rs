//! [`Location`]: the one reading of a store location, shared by
//! [`super::open`], [`super::StoreReader::open`],
//! [`crate::ReceiverBuilder::store`] and every command's `--store`.

use super::StoreError;

/// Where a receiver keeps what it decided, as written in `--store` and in
/// [`crate::ReceiverBuilder::store`]:
///
/// | text | location |
/// |---|---|
/// | `memory` | [`Location::Memory`]: nothing durable |
/// | `sqlite:PATH` | [`Location::Sqlite`], a file (created when a receiver opens it) |
/// | `postgres://...`, `postgresql://...` | [`Location::Postgres`], a libpq-style URL |
/// | `lsm:DIR` | [`Location::Lsm`], a directory (created when a receiver opens it) |
///
/// The grammar does not depend on the crate's features: `postgres://...`
/// parses in a build without the `postgres` feature, and opening it says
/// that the feature is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Location {
    /// `memory`: the receiver keeps everything in its own process; nothing
    /// survives it, and nothing outside it can read it.
    Memory,
    /// `sqlite:PATH`: a SQLite file, the path as written after `sqlite:`
    /// (relative to the working directory; never empty).
    Sqlite(String),
    /// A PostgreSQL connection URL, as written (`postgres://` or
    /// `postgresql://`).
    Postgres(String),
    /// `lsm:DIR`: the log-structured store's directory, the path as written
    /// after `lsm:` (relative to the working directory; never empty). One
    /// process at a time; opened by a build with the `lsm` feature.
    Lsm(String),
}

/// What every message about a location offers.
const EXPECTED: &str = "expected memory, sqlite:PATH, postgres://USER@HOST:PORT/DB or lsm:DIR";

impl Location {
    /// Reads a location (surrounding whitespace is not trimmed: a path may
    /// hold any character).
    ///
    /// # Errors
    /// [`StoreError::InvalidLocation`] naming the text and what is wrong:
    /// empty text, `sqlite:` with no path, a URL scheme other than
    /// `postgres`/`postgresql` (for example `mysql://...`: "unsupported
    /// scheme"), or anything else.
    pub fn parse(text: &str) -> Result<Self, StoreError> {
        if text == "memory" {
            return Ok(Self::Memory);
        }
        if let Some(path) = text.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(StoreError::InvalidLocation(
                    "`sqlite:` has no path: write sqlite:PATH, for example sqlite:receiver.db"
                        .to_owned(),
                ));
            }
            return Ok(Self::Sqlite(path.to_owned()));
        }
        if let Some(path) = text.strip_prefix("lsm:") {
            if path.is_empty() {
                return Err(StoreError::InvalidLocation(
                    "`lsm:` has no directory: write lsm:DIR, for example lsm:receiver.lsm"
                        .to_owned(),
                ));
            }
            return Ok(Self::Lsm(path.to_owned()));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Self::Postgres(text.to_owned()));
        }
        if text.is_empty() {
            return Err(StoreError::InvalidLocation(format!(
                "empty store location: {EXPECTED}"
            )));
        }
        if let Some((scheme, _)) = text.split_once("://") {
            return Err(StoreError::InvalidLocation(format!(
                "unsupported scheme `{scheme}` in {text:?}: {EXPECTED}"
            )));
        }
        Err(StoreError::InvalidLocation(format!(
            "unknown store {text:?}: {EXPECTED}"
        )))
    }

    /// Whether this is [`Location::Memory`].
    pub fn is_memory(&self) -> bool {
        matches!(self, Self::Memory)
    }
}

/// The longest schema name PostgreSQL keeps whole, in bytes (`NAMEDATALEN`
/// − 1): a longer name is cut there, so that the store would create one
/// name and look for another.
pub(crate) const SCHEMA_NAME_MAX: usize = 63;

/// Checks a PostgreSQL schema name (`--store-schema`) before anything is
/// created: 1 to [`SCHEMA_NAME_MAX`] lower-case ASCII letters, digits and
/// underscores, not starting with a digit. Upper case is refused rather
/// than quoted: PostgreSQL folds an unquoted name to lower case (its
/// manual, "Identifiers and Key Words"), and earlier versions created and
/// wrote the schema `rt_mixed` for `rt_Mixed`, so that quoting now would
/// open another, empty schema beside the user's data. The store still
/// quotes the name in its SQL ([`quoted_schema`]), so that a name that is
/// also a key word (`user`) works.
///
/// # Errors
/// [`StoreError::InvalidLocation`] naming the schema and what is wrong.
pub(crate) fn check_schema_name(name: &str) -> Result<(), StoreError> {
    let refuse = |why: String| {
        Err(StoreError::InvalidLocation(format!(
            "schema name {name:?}: {why}"
        )))
    };
    if name.is_empty() || name.len() > SCHEMA_NAME_MAX {
        return refuse(format!("must be 1 to {SCHEMA_NAME_MAX} characters"));
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return refuse("must start with a letter or an underscore".to_owned());
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return refuse("must be lower-case ASCII letters, digits and underscores".to_owned());
    }
    if name.chars().any(|c| c.is_ascii_uppercase()) {
        return refuse(format!(
            "PostgreSQL folds names to lower case (and earlier versions created the schema \
             {lower} for it): give it in lower case, {lower}",
            lower = name.to_ascii_lowercase()
        ));
    }
    Ok(())
}

/// `name`, checked by [`check_schema_name`], as a quoted SQL identifier.
#[cfg(feature = "postgres")]
pub(crate) fn quoted_schema(name: &str) -> String {
    format!("\"{name}\"")
}

impl std::str::FromStr for Location {
    type Err = StoreError;

    fn from_str(text: &str) -> Result<Self, StoreError> {
        Self::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_checked_before_anything_is_created() {
        let why = |name: &str| match check_schema_name(name) {
            Err(StoreError::InvalidLocation(why)) => why,
            other => panic!("{name:?}: {other:?}"),
        };
        for good in ["rt_mixed", "_x", "a1", "user", &"a".repeat(63)] {
            assert!(check_schema_name(good).is_ok(), "{good}");
        }
        assert_eq!(
            why("rt_Mixed"),
            "schema name \"rt_Mixed\": PostgreSQL folds names to lower case (and earlier \
             versions created the schema rt_mixed for it): give it in lower case, rt_mixed"
        );
        assert_eq!(why(""), "schema name \"\": must be 1 to 63 characters");
        assert_eq!(
            why(&"a".repeat(64)),
            format!(
                "schema name {:?}: must be 1 to 63 characters",
                "a".repeat(64)
            )
        );
        assert_eq!(
            why("1st"),
            "schema name \"1st\": must start with a letter or an underscore"
        );
        assert_eq!(
            why("a-b"),
            "schema name \"a-b\": must be lower-case ASCII letters, digits and underscores"
        );
        assert_eq!(
            why("a\"; DROP"),
            "schema name \"a\\\"; DROP\": must be lower-case ASCII letters, digits and underscores"
        );
    }

    fn refused(text: &str) -> String {
        match Location::parse(text) {
            Err(StoreError::InvalidLocation(why)) => why,
            other => panic!("{text:?}: {other:?}"),
        }
    }

    #[test]
    fn the_three_forms() {
        assert_eq!(Location::parse("memory"), Ok(Location::Memory));
        assert_eq!(
            Location::parse("sqlite:a/b.db"),
            Ok(Location::Sqlite("a/b.db".to_owned()))
        );
        assert_eq!(
            Location::parse("sqlite::memory:"),
            Ok(Location::Sqlite(":memory:".to_owned()))
        );
        for url in ["postgres://u@h/db", "postgresql://u:p@h:5432/db"] {
            assert_eq!(Location::parse(url), Ok(Location::Postgres(url.to_owned())));
        }
        assert!("memory".parse::<Location>().unwrap().is_memory());
    }

    #[test]
    fn what_is_refused_and_why() {
        assert_eq!(
            refused("sqlite:"),
            "`sqlite:` has no path: write sqlite:PATH, for example sqlite:receiver.db"
        );
        assert_eq!(
            refused("mysql://x"),
            "unsupported scheme `mysql` in \"mysql://x\": expected memory, sqlite:PATH, postgres://USER@HOST:PORT/DB or lsm:DIR"
        );
        assert_eq!(
            refused(""),
            "empty store location: expected memory, sqlite:PATH, postgres://USER@HOST:PORT/DB or lsm:DIR"
        );
        assert_eq!(
            refused("receiver.db"),
            "unknown store \"receiver.db\": expected memory, sqlite:PATH, postgres://USER@HOST:PORT/DB or lsm:DIR"
        );
        // Case matters, as in every other location.
        assert_eq!(
            refused("Memory"),
            "unknown store \"Memory\": expected memory, sqlite:PATH, postgres://USER@HOST:PORT/DB or lsm:DIR"
        );
    }

    /// A build without the `postgres` feature parses the URL and says, in
    /// the receiver's start-up error, that the feature is missing.
    #[cfg(not(feature = "postgres"))]
    #[tokio::test]
    async fn postgres_without_the_feature_says_so() {
        let e = crate::Receiver::builder()
            .store("postgres://u@127.0.0.1/db")
            .build()
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "cannot open or read the durable store: store failure: cannot open a postgres:// \
             store: this build of snapshot-receiver has no `postgres` feature"
        );
    }
}
