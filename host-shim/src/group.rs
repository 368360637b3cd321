//! `symmGroupStart` / `symmGroupEnd`: one thread driving several ranks defers window
//! completion and collective launches to the end of the group, where every rank's part is
//! known and they can run together.

use crate::collective::Task;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::window::{self, Window};
use std::cell::RefCell;
use std::sync::Arc;

/// Work deferred to the end of the group.
pub enum Deferred {
    /// Finish a window registration.
    CompleteWindow(Arc<Comm>, Arc<Window>),
    /// Launch a collective.
    Collective(Task),
}

#[derive(Default)]
struct Group {
    depth: u32,
    deferred: Vec<Deferred>,
}

std::thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// `true` between `symmGroupStart` and the matching `symmGroupEnd` on this thread.
pub fn active() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Queue `item` for the end of the group.
pub fn defer(item: Deferred) {
    GROUP.with(|g| g.borrow_mut().deferred.push(item));
}

/// `symmGroupStart`: groups nest.
pub fn start() -> Result<()> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.depth = g
            .depth
            .checked_add(1)
            .ok_or_else(|| Error::invalid_usage("groups nested too deeply"))?;
        Ok(())
    })
}

/// `symmGroupEnd`: at the outermost end, complete windows, then run every collective (on the
/// host backend concurrently, one thread per task, and wait for all).
pub fn end() -> Result<()> {
    let deferred = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(
                "symmGroupEnd without a matching symmGroupStart",
            ));
        }
        g.depth -= 1;
        Ok(if g.depth == 0 {
            std::mem::take(&mut g.deferred)
        } else {
            Vec::new()
        })
    })?;

    let mut first_error: Option<Error> = None;
    let mut record = |comm: &Comm, result: Result<()>| {
        if let Err(e) = result {
            comm.set_last_error(&e.message);
            first_error.get_or_insert(e);
        }
    };
    let mut tasks = Vec::new();
    for item in deferred {
        match item {
            Deferred::CompleteWindow(comm, window) => {
                let result = window::complete(&comm, &window);
                record(&comm, result);
            }
            Deferred::Collective(task) => tasks.push(task),
        }
    }
    let results: Vec<Result<()>> = if tasks.iter().all(Task::runs_to_completion) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = tasks
                .iter()
                .map(|task| scope.spawn(move || task.execute()))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::internal("a host kernel panicked")))
                })
                .collect()
        })
    } else {
        tasks.iter().map(Task::execute).collect()
    };
    for (task, result) in tasks.iter().zip(results) {
        record(&task.comm, result);
    }
    first_error.map_or(Ok(()), Err)
}
