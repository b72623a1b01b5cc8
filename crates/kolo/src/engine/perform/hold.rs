//! The engine's hold: the submissions taken from the table, by tensor id,
//! until their responses come; and taking their entries out of it for a
//! response (one by one, or a whole repeated submission at once).

use super::{Performer, Work};
use crate::engine::batches::{Batches, Whole};
use crate::engine::placement::PlaneSlot;
use crate::engine::table::{Entry, Requests, Taken};
use kolo_coordinator::{Intake, TensorId};
use kolo_transport::Backend;
use std::sync::Arc;

impl<B: Backend, D: PlaneSlot> Performer<B, D> {
    /// Holds the submissions taken from the table and returns their
    /// requests, in order.
    pub(crate) fn hold(&mut self, taken: Taken) -> Intake {
        // A repeated group alone (a training step that repeats the last)
        // goes to the coordinator as one.
        let group = match taken.submissions.as_slice() {
            [q] if matches!(q.requests, Requests::Repeat) => Some(Arc::clone(&q.ids)),
            _ => None,
        };
        let tensors = match group {
            Some(_) => 0,
            None => taken.submissions.iter().map(|q| q.ids.len()).sum(),
        };
        let mut requests = Vec::with_capacity(tensors);
        for mut q in taken.submissions {
            if group.is_none() {
                for index in 0..q.ids.len() {
                    requests.push(q.submission(index));
                }
            }
            let ids = Arc::clone(&q.ids);
            let key = self.batches.add(q.completion, Arc::clone(&ids), q.inputs);
            for (index, id) in ids.iter().enumerate() {
                if self.held.len() <= id.index() {
                    self.held.resize(id.index() + 1, None);
                }
                // The table refuses a name in flight, so the place is free;
                // if not (a kolo bug), the part replaced fails when its
                // submission is dropped.
                self.held[id.index()] = Some(Batches::part(key, index as u32));
            }
        }
        match group {
            Some(ids) => Intake::Group(ids),
            None => Intake::Each(requests),
        }
    }

    /// Takes this rank's entries for the tensors of `members` out of the
    /// engine's hold, in order (`None` where this rank has none).
    pub(super) fn take_entries(
        &mut self,
        work: &[Work<'_>],
        members: &[usize],
    ) -> Vec<Option<Entry>> {
        let mut slots = Vec::with_capacity(members.len());
        for &m in members {
            let w = &work[m];
            // An id comes only with a single-tensor response (see
            // `kolo_coordinator::Agreed`): its response is not read.
            match (w.id, w.response) {
                (Some(id), _) => slots.push(self.take_entry(id)),
                (None, response) => {
                    let names = &response.tensor_names;
                    // A join (several names), or a name this rank's
                    // coordinator did not settle: by name.
                    let ids: Vec<Option<TensorId>> = {
                        let table = self.shared.table.lock();
                        names.iter().map(|name| table.id(name)).collect()
                    };
                    for id in ids {
                        slots.push(id.and_then(|id| self.take_entry(id)));
                    }
                }
            }
        }
        slots
    }

    /// The submission whose tensors `members` are, all of them in any
    /// order, if they are one whole submission none of whose tensors was
    /// performed yet (a repeated group settled by the cache: then its
    /// fused allreduce runs straight over the submission's lent memory,
    /// in the members' order). The tensors are taken from the hold.
    pub(super) fn whole_submission(
        &mut self,
        work: &[Work<'_>],
        members: &[usize],
    ) -> Option<Whole> {
        let first = work[*members.first()?].id?;
        let (key, _) = Batches::locate((*self.held.get(first.index())?)?);
        let ids = self.batches.ids(key)?;
        if ids.len() != members.len() {
            return None;
        }
        // The part at each position, once a position holds another part
        // than its own (until then, part i at position i).
        let mut order: Option<Vec<u32>> = None;
        // Each part once: a cycle may hold one tensor's id in two places
        // (a refused tensor beside its cached response).
        let mut seen = vec![false; members.len()];
        for (position, &m) in members.iter().enumerate() {
            let id = work[m].id?;
            let part = (*self.held.get(id.index())?)?;
            let (batch, index) = Batches::locate(part);
            // The part must be this tensor's in the submission held now
            // (a hold left from a done submission may name a key since
            // reused).
            if batch != key || ids.get(index as usize) != Some(&id) {
                return None;
            }
            if std::mem::replace(&mut seen[index as usize], true) {
                return None;
            }
            if order.is_none() && index != position as u32 {
                order = Some((0..position as u32).collect());
            }
            if let Some(order) = &mut order {
                order.push(index);
            }
        }
        // The members are all of the submission's parts, each once;
        // claiming it whole checks that none is done.
        let order = order.map(Arc::from);
        let whole = self.batches.claim_whole(key, members.len(), order)?;
        for &m in members {
            if let Some(held) = work[m].id.and_then(|id| self.held.get_mut(id.index())) {
                *held = None;
            }
        }
        Some(whole)
    }

    /// The tensor `id` this rank holds.
    fn take_entry(&mut self, id: TensorId) -> Option<Entry> {
        let part = self.held.get_mut(id.index())?.take()?;
        Some(Entry {
            id,
            input: self.batches.take_input(part),
            part,
        })
    }
}
