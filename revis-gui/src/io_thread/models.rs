//! The models: the catalog as this machine sees it (memory, expected
//! speed, what is downloaded) and a download with progress, which may be
//! the machine's first model and default.

use super::{Internal, Io};
use crate::protocol::Event;

impl Io {
    /// The catalog as this machine sees it (memory, expected speed), and what is downloaded.
    pub(super) fn list_models(&self) {
        let (sink, dir) = (self.sink.clone(), self.opts.paths().models());
        tokio::spawn(async move {
            let here = revis_client::speed::measure_here(&dir).await;
            sink.send(Event::Models(Box::new(models_info(&dir, here))));
        });
    }

    /// Downloads a model (catalog name or `hf:` reference) with progress;
    /// the first model of a machine becomes its default and revisd starts.
    pub(super) fn pull(&mut self, name: String, anyway: bool) {
        if self.pull_cancel.is_some() {
            return self
                .sink
                .send(Event::PullDone { model: name, result: Err("another download is under way; wait for it or cancel it".into()) });
        }
        let model = match revis_models::ModelRef::parse_known(name.trim()) {
            Ok(m) => m,
            Err(e) => return self.sink.send(Event::PullDone { model: name, result: Err(e.to_string()) }),
        };
        let cancel = revis_models::Cancel::new();
        self.pull_cancel = Some(cancel.clone());
        let (sink, dir) = (self.sink.clone(), self.opts.paths().models());
        let first = !revis_models::any_downloaded(&dir);
        let shown = model.to_string();
        let progress = {
            let (sink, shown) = (sink.clone(), shown.clone());
            revis_models::Reporter::new(move |label, done, total| {
                sink.send(Event::PullProgress { model: shown.clone(), label: label.to_owned(), done, total });
            })
        };
        let opts = revis_models::PullOptions {
            progress: revis_models::Progress::Report(progress),
            cancel: Some(cancel),
            ..self.opts.pull.clone()
        };
        let task = tokio::task::spawn_blocking(move || {
            // A catalog model's memory is checked in the view; a Hugging Face file's size is known once the Hub is asked.
            if let (revis_models::ModelRef::HuggingFace(r), false) = (&model, anyway) {
                let file = revis_models::resolve_hf(r, &opts)?;
                let memory = revis_models::machine::memory_bytes();
                if file.size as f64 > revis_models::choose::MEMORY_SHARE * memory as f64 {
                    let size = revis_models::choose::human_bytes;
                    return Ok(Err(format!(
                        "Its file is {}, more than half of this machine's {} of memory; other programs may slow down.",
                        size(file.size),
                        size(memory)
                    )));
                }
            }
            let path = model.pull(&dir, &opts)?;
            if first {
                revis_models::set_default_model(&dir, &model)?;
            }
            Ok::<_, revis_models::Error>(Ok(path))
        });
        let tx = self.internal.clone();
        tokio::spawn(async move {
            let result = match task.await {
                Ok(Ok(Err(why))) => {
                    sink.send(Event::PullTooLarge { model: shown, why });
                    let _ = tx.send(Internal::PullEnded { start: false });
                    return;
                }
                Ok(Ok(Ok(path))) if first => {
                    Ok(format!("{shown} is downloaded ({}) and is the default model; starting revisd…", path.display()))
                }
                Ok(Ok(Ok(path))) => Ok(format!("{shown} is downloaded ({}). Use it for a tier below.", path.display())),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let start = first && result.is_ok();
            sink.send(Event::PullDone { model: shown, result });
            let _ = tx.send(Internal::PullEnded { start });
        });
    }
}

/// The catalog as this machine (`here`, measured) sees it.
fn models_info(dir: &std::path::Path, here: revis_client::speed::Here) -> crate::protocol::ModelsInfo {
    use revis_models::choose::human_bytes;
    let machine = here.machine;
    let catalog = revis_models::catalog();
    let recommended = revis_models::choose(&machine, catalog).entry.name;
    let rows = catalog
        .iter()
        .map(|e| {
            let est = revis_models::choose::estimate(e, &machine);
            crate::protocol::ModelRow {
                name: e.name.to_owned(),
                params: e.params.to_owned(),
                description: e.description.to_owned(),
                size: human_bytes(e.size),
                memory: human_bytes(est.memory_bytes),
                tokens_per_s: est.tokens_per_s,
                measured: machine.decode.as_ref().is_some_and(|d| d.model == e.name),
                fits_memory: est.fits_memory,
                fits: est.fits(),
                downloaded: e.is_present(dir),
                recommended: e.name == recommended,
            }
        })
        .collect();
    // Models pulled by Hugging Face reference, by the name that finds them again.
    let other = revis_models::downloaded_hf(dir).into_iter().map(|(name, size)| (name, human_bytes(size))).collect();
    crate::protocol::ModelsInfo {
        machine: match &here.note {
            Some(note) => format!("{}; {note}", machine.describe()),
            None => machine.describe(),
        },
        busy: machine.busy(),
        rows,
        other,
        default_model: revis_models::default_model(dir),
        dir: dir.display().to_string(),
    }
}
