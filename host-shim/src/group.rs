//! `symmGroupStart` / `symmGroupEnd`: one thread driving several ranks defers window
//! completion and collective launches to the end of the group, where every rank's part is
//! known and they can run together.

use crate::collective::{self, Task};
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
    for wave in waves(&tasks) {
        let results: Vec<Result<()>> = if wave.len() > 1 && wave[0][0].runs_to_completion() {
            // Host launches return when done: launches of one wave run side by side.
            std::thread::scope(|scope| {
                let handles: Vec<_> = wave
                    .iter()
                    .map(|launch| scope.spawn(move || collective::execute(launch)))
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
            wave.iter()
                .map(|launch| collective::execute(launch))
                .collect()
        };
        for (launch, result) in wave.iter().zip(results) {
            if let Err(e) = result {
                for task in launch {
                    task.comm.set_last_error(&e.message);
                }
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Merge the group's tasks into launches (parts of one collective: equal launch keys,
/// distinct ranks; each task joins the first launch that fits), and the launches into waves of launches that touch distinct
/// ranks and may run at the same time. Waves run in order, so two collectives of one rank in
/// a group run in the order they were called.
fn waves(tasks: &[Task]) -> Vec<Vec<Vec<&Task>>> {
    let mut launches: Vec<Vec<&Task>> = Vec::new();
    for task in tasks {
        let key = task.launch_key();
        let joinable = launches.iter_mut().find(|l| {
            l[0].launch_key() == key && l.iter().all(|t| !Arc::ptr_eq(&t.comm, &task.comm))
        });
        match joinable {
            Some(launch) => launch.push(task),
            None => launches.push(vec![task]),
        }
    }
    let mut waves: Vec<Vec<Vec<&Task>>> = Vec::new();
    let mut busy: Vec<*const Comm> = Vec::new();
    for launch in launches {
        let ranks: Vec<*const Comm> = launch.iter().map(|t| Arc::as_ptr(&t.comm)).collect();
        if waves.is_empty() || ranks.iter().any(|r| busy.contains(r)) {
            waves.push(Vec::new());
            busy.clear();
        }
        busy.extend(ranks);
        waves.last_mut().expect("a wave exists").push(launch);
    }
    waves
}
