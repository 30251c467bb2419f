//! Where a command's output goes: standard output for results (objects, tables), standard
//! error for progress, warnings and errors. In memory for tests and embedding.

use std::io::Write;

/// Exit code of a command that failed (usage errors exit with 2, as clap does).
pub const FAILURE: i32 = 1;
use std::sync::{Arc, Mutex, PoisonError};

/// A command's two output streams.
pub struct Terminal {
    out: Box<dyn Write + Send>,
    err: Box<dyn Write + Send>,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal").finish_non_exhaustive()
    }
}

/// Output captured by [`Terminal::capture`].
#[derive(Clone, Debug, Default)]
pub struct Captured {
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
}

impl Captured {
    /// What was written to standard output so far.
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap_or_else(PoisonError::into_inner))
            .into_owned()
    }

    /// What was written to standard error so far.
    pub fn err(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap_or_else(PoisonError::into_inner))
            .into_owned()
    }
}

struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Terminal {
    /// The process's standard output and error.
    pub fn stdio() -> Self {
        Self {
            out: Box::new(std::io::stdout()),
            err: Box::new(std::io::stderr()),
        }
    }

    /// A terminal whose output is kept in memory.
    pub fn capture() -> (Self, Captured) {
        let captured = Captured::default();
        let term = Self {
            out: Box::new(Shared(Arc::clone(&captured.out))),
            err: Box::new(Shared(Arc::clone(&captured.err))),
        };
        (term, captured)
    }

    /// Write to standard output (results). Write errors (a closed pipe) are ignored: the
    /// command's outcome does not depend on whether anyone reads.
    pub fn out(&mut self, text: &str) {
        let _ = self.out.write_all(text.as_bytes());
        let _ = self.out.flush();
    }

    /// Write to standard error (progress, warnings, errors).
    pub fn err(&mut self, text: &str) {
        let _ = self.err.write_all(text.as_bytes());
        let _ = self.err.flush();
    }
}
