//! Planner errors: one variant per kind of mistake a user can make, each with its
//! SQLSTATE, so no one parses messages.

/// A user-facing error with PostgreSQL's primary message, optional detail and hint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Syntax,
    UndefinedTable,
    UndefinedObject,
    DuplicateObject,
    UndefinedColumn,
    /// An unqualified column that more than one FROM item has.
    AmbiguousColumn,
    UndefinedFunction,
    /// A schema that does not exist.
    InvalidSchemaName,
    /// A bad bucket count or bounds in `width_bucket`.
    InvalidWidthBucket,
    /// A LIKE pattern that ends with its escape character, or an escape of more than one
    /// character.
    InvalidEscapeSequence,
    /// An argument outside a power or root function's domain (`sqrt(-1)`).
    InvalidPowerArgument,
    /// The logarithm of zero or of a negative number.
    InvalidLogArgument,
    /// A parameter only the server sets (`SET shared_buffers`).
    CantChangeParameter,
    /// A function of another kind than the call needs (a window function without OVER).
    WrongObjectType,
    Grouping,
    DatatypeMismatch,
    NotNullViolation,
    InvalidText,
    /// Date or time text of no form PostgreSQL reads.
    InvalidDatetime,
    /// Date or time text with a field out of its range (month 13, hour 25).
    DatetimeOutOfRange,
    BadCopyFormat,
    NumericOutOfRange,
    Unsupported,
    DependentObjects,
    InvalidParameter,
    ResourcesExhausted,
    /// A configured limit was reached (a subscription fell too far behind).
    LimitExceeded,
    /// A named limit of the node (`limits`) was reached by one statement or message.
    ProgramLimitExceeded,
    /// A connection limit was reached.
    TooManyConnections,
    /// The role may not do this (`GRANT`, ownership, superuser).
    InsufficientPrivilege,
    /// Bytes that are not UTF-8.
    InvalidEncoding,
    /// DECLARE outside a transaction block.
    NoActiveTransaction,
    DuplicateCursor,
    UndefinedCursor,
    DuplicatePreparedStatement,
    UndefinedPreparedStatement,
    /// A node that runs part of the statement cannot be reached now (retry).
    Unavailable,
    /// 55000: the object is not in a state that allows the operation.
    NotInPrerequisiteState,
    /// The statement was cancelled (`statement_timeout`) before it applied anything.
    QueryCanceled,
    /// The statement's outcome is not known: the log did not confirm it in time (it
    /// may still apply, once).
    CompletionUnknown,
    DivisionByZero,
    /// A scalar subquery returned more than one row.
    CardinalityViolation,
    /// A negative LIMIT.
    InvalidLimit,
    /// A negative OFFSET.
    InvalidOffset,
    /// A data directory's filesystem is full, or below the node's reserve (retry once
    /// space is freed).
    DiskFull,
    Internal,
}

impl ErrorKind {
    /// The SQLSTATE PostgreSQL gives this kind of error.
    pub fn sqlstate(self) -> &'static str {
        match self {
            ErrorKind::Syntax => "42601",
            ErrorKind::UndefinedTable => "42P01",
            ErrorKind::UndefinedObject => "42704",
            ErrorKind::DuplicateObject => "42P07",
            ErrorKind::UndefinedColumn => "42703",
            ErrorKind::AmbiguousColumn => "42702",
            ErrorKind::UndefinedFunction => "42883",
            ErrorKind::WrongObjectType => "42809",
            ErrorKind::CantChangeParameter => "55P02",
            ErrorKind::InvalidWidthBucket => "2201G",
            ErrorKind::InvalidEscapeSequence => "22025",
            ErrorKind::InvalidPowerArgument => "2201F",
            ErrorKind::InvalidLogArgument => "2201E",
            ErrorKind::InvalidSchemaName => "3F000",
            ErrorKind::Grouping => "42803",
            ErrorKind::DatatypeMismatch => "42804",
            ErrorKind::NotNullViolation => "23502",
            ErrorKind::InvalidText => "22P02",
            ErrorKind::InvalidDatetime => "22007",
            ErrorKind::DatetimeOutOfRange => "22008",
            ErrorKind::BadCopyFormat => "22P04",
            ErrorKind::NumericOutOfRange => "22003",
            ErrorKind::Unsupported => "0A000",
            ErrorKind::DependentObjects => "2BP01",
            ErrorKind::InvalidParameter => "22023",
            ErrorKind::ResourcesExhausted => "53000",
            ErrorKind::LimitExceeded => "53400",
            ErrorKind::ProgramLimitExceeded => "54000",
            ErrorKind::QueryCanceled => "57014",
            ErrorKind::CompletionUnknown => "40003",
            ErrorKind::DivisionByZero => "22012",
            ErrorKind::CardinalityViolation => "21000",
            ErrorKind::InvalidLimit => "2201W",
            ErrorKind::InvalidOffset => "2201X",
            ErrorKind::TooManyConnections => "53300",
            ErrorKind::InsufficientPrivilege => "42501",
            ErrorKind::InvalidEncoding => "22021",
            ErrorKind::NoActiveTransaction => "25P01",
            ErrorKind::DuplicateCursor => "42P03",
            ErrorKind::UndefinedCursor => "34000",
            ErrorKind::DuplicatePreparedStatement => "42P05",
            ErrorKind::UndefinedPreparedStatement => "26000",
            ErrorKind::Unavailable => "57P03",
            ErrorKind::NotInPrerequisiteState => "55000",
            ErrorKind::DiskFull => "53100",
            ErrorKind::Internal => "XX000",
        }
    }
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            detail: None,
            hint: None,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Error {
        self.hint = Some(hint.into());
        self
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Error {
        self.detail = Some(detail.into());
        self
    }

    pub fn syntax(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Syntax, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Unsupported, message)
    }

    pub fn undefined_column(column: &str, relation: &str) -> Error {
        Error::new(
            ErrorKind::UndefinedColumn,
            format!("column \"{column}\" of relation \"{relation}\" does not exist"),
        )
    }

    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, message)
    }

    /// 53100: a write found no room on disk; nothing of the statement was applied.
    pub fn disk_full(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::DiskFull, message).with_hint(
            "Free space on the data directory's filesystem (or grow it); ingestion resumes \
             on its own, and reads keep working meanwhile.",
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// 42P01 for a stream that is not in the catalog.
pub fn undefined_stream(name: &str) -> Error {
    Error::new(
        ErrorKind::UndefinedTable,
        format!("stream \"{name}\" does not exist"),
    )
}
