//! The ensemble as a [`Runner`]: rounds of drafts from every member, one
//! winner per round appended for everyone, members that fail left out.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::combine::{self, Span, Weights};
use super::settings::{EnsembleSpec, Method};
use crate::Client;
use crate::api::{
    CallError, Code, Done, EmbedParams, Embedded, FinishReason, Format, GenerateParams, PrefillParams, Prefilled, Runner, ScoreParams,
    Tier, TierStatus, TokenLogprob,
};
use crate::fold::DoneFold;

/// An answer's length when the request does not say (the daemon's own default).
const DEFAULT_MAX_TOKENS: u32 = 512;
/// Alternatives the `merge` drafter reports per token: the candidate next words.
const MERGE_CANDIDATES: u32 = 5;
/// Rounds in a row that may add no text before the answer is taken as ended.
const MAX_IDLE_ROUNDS: u32 = 2;

/// One model of an ensemble: a tier of a daemon (this machine's or a paired node's).
#[derive(Clone)]
pub struct Member {
    /// As the user knows it: "tier2" or "desktop/tier3".
    pub name: String,
    pub client: Client,
    pub tier: Tier,
}

/// What an ensemble did, counted over every answer it gave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub rounds: u64,
    /// Calls sent to members (drafts, scores, continuations).
    pub calls: u64,
    /// Bytes of answer text produced.
    pub bytes: u64,
    /// Rounds won by each member's draft (by member index; at most 8 kept).
    pub wins: [u64; 8],
    /// Members left out of an answer after failing or missing a deadline.
    pub dropped: u64,
}

type OnFailure = Arc<dyn Fn(&str, &CallError) + Send + Sync>;

/// Two or more different models answering together (see the module docs
/// of [`crate::ensemble`]). Cheap to clone; clones share weights and stats.
#[derive(Clone)]
pub struct Ensemble {
    members: Vec<Member>,
    spec: EnsembleSpec,
    weights: Arc<Mutex<Weights>>,
    stats: Arc<Mutex<Stats>>,
    on_failure: Option<OnFailure>,
}

/// A member's draft: its tokens with their log-probabilities, its text and how it ended.
struct Draft {
    tokens: Vec<TokenLogprob>,
    text: String,
    done: Done,
}

/// What each member is asked to draft: how many tokens, with how many
/// alternatives per token, within what time.
#[derive(Clone, Copy)]
struct DraftAsk {
    max_tokens: u32,
    top: u32,
    deadline: Duration,
}

/// What one round adds to the answer.
struct Step {
    text: String,
    tokens: u32,
    /// The answer ends here, for this reason.
    ends: Option<FinishReason>,
    /// Member index whose draft won (None: a mixture chose).
    winner: Option<usize>,
}

impl Ensemble {
    /// `members` in order: the first one drafts in `merge` and is the last
    /// to give up a tie.
    pub fn new(members: Vec<Member>, spec: EnsembleSpec) -> Ensemble {
        let n = members.len();
        Ensemble {
            members,
            spec,
            weights: Arc::new(Mutex::new(Weights::equal(n))),
            stats: Arc::new(Mutex::new(Stats::default())),
            on_failure: None,
        }
    }

    /// Keeps `cross`'s weights in `weights` (shared across ensembles built
    /// for the same tier, so what was learned lasts beyond one answer).
    pub fn with_weights(mut self, weights: Arc<Mutex<Weights>>) -> Ensemble {
        let n = self.members.len();
        {
            let mut w = weights.lock().unwrap_or_else(|e| e.into_inner());
            if w.as_slice().len() != n {
                *w = Weights::equal(n);
            }
        }
        self.weights = weights;
        self
    }

    /// Called with a member's name when it fails or misses a deadline (the
    /// dispatcher opens its breaker: it rejoins after a health check).
    pub fn on_failure(mut self, f: impl Fn(&str, &CallError) + Send + Sync + 'static) -> Ensemble {
        self.on_failure = Some(Arc::new(f));
        self
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    pub fn weights(&self) -> Weights {
        self.weights.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn stats(&self) -> Stats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut Stats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn drop_member(&self, alive: &mut Vec<usize>, m: usize, e: &CallError) {
        if let Some(at) = alive.iter().position(|&a| a == m) {
            alive.remove(at);
            tracing::warn!(member = %self.members[m].name, "an ensemble member sits out: {}", e.message);
            self.count(|s| s.dropped += 1);
            if let Some(f) = &self.on_failure {
                f(&self.members[m].name, e);
            }
        }
    }

    /// Runs `call` on each member of `on` at once, each within `deadline`;
    /// results by member index. Members that fail are dropped from `alive`.
    async fn each<T: Send + 'static, F>(
        &self,
        alive: &mut Vec<usize>,
        on: &[usize],
        deadline: Duration,
        call: impl Fn(usize, Member) -> F,
    ) -> (Vec<(usize, T)>, Option<CallError>)
    where
        F: Future<Output = Result<T, CallError>> + Send + 'static,
    {
        let mut set = JoinSet::new();
        for &m in on {
            let member = self.members[m].clone();
            let name = member.name.clone();
            let fut = call(m, member);
            self.count(|s| s.calls += 1);
            set.spawn(async move {
                let r = match tokio::time::timeout(deadline, fut).await {
                    Ok(r) => r,
                    Err(_) => Err(CallError::new(
                        Code::DeadlineExceeded,
                        format!("{name} did not answer within the round's deadline of {:.1} s", deadline.as_secs_f64()),
                    )),
                };
                (m, r)
            });
        }
        let mut ok = Vec::new();
        let mut last_error = None;
        while let Some(joined) = set.join_next().await {
            let (m, r) =
                joined.unwrap_or_else(|e| (usize::MAX, Err(CallError::new(Code::Internal, format!("a member's call panicked: {e}")))));
            match r {
                Ok(v) => ok.push((m, v)),
                Err(e) => {
                    if m != usize::MAX {
                        self.drop_member(alive, m, &e);
                    }
                    last_error = Some(e);
                }
            }
        }
        ok.sort_by_key(|(m, _)| *m);
        (ok, last_error)
    }

    /// Each member of `on` drafts the next span after `answer`.
    async fn drafts(
        &self,
        alive: &mut Vec<usize>,
        on: &[usize],
        req: &GenerateParams,
        answer: &str,
        ask: DraftAsk,
    ) -> (Vec<(usize, Draft)>, Option<CallError>) {
        let req = req.clone();
        let answer = answer.to_owned();
        self.each(alive, on, ask.deadline, move |_, m: Member| {
            let params = GenerateParams {
                tier: m.tier,
                answer_prefix: answer.clone(),
                max_tokens: Some(ask.max_tokens),
                logprobs: Some(ask.top),
                ..req.clone()
            };
            async move { draft(&m.client, &params).await }
        })
        .await
    }

    /// Fills in what each member of `on` lacks of `known[m][c]` (member m's
    /// whole log-probability of candidate c after `answer`, and its bytes):
    /// one Score call per member, with only the candidates it has no figure
    /// for (a drafter knows its own draft's). A member that fails keeps None.
    async fn scores(
        &self,
        alive: &mut Vec<usize>,
        on: &[usize],
        req: &GenerateParams,
        answer: &str,
        candidates: &[String],
        known: &mut [Vec<Option<(f64, usize)>>],
    ) {
        let missing: Vec<Vec<usize>> = known.iter().map(|row| (0..candidates.len()).filter(|&c| row[c].is_none()).collect()).collect();
        let on: Vec<usize> = on.iter().copied().filter(|&m| !missing[m].is_empty()).collect();
        if on.is_empty() {
            return;
        }
        let (messages, static_messages) = (req.messages.clone(), req.static_messages);
        let answer = answer.to_owned();
        let texts: Vec<Vec<String>> = missing.iter().map(|cs| cs.iter().map(|&c| candidates[c].clone()).collect()).collect();
        let (ok, _) = self
            .each(alive, &on, self.spec.round_deadline, move |i, m: Member| {
                let params = ScoreParams {
                    tier: m.tier,
                    messages: messages.clone(),
                    static_messages,
                    prefix: answer.clone(),
                    continuations: texts[i].clone(),
                    top_logprobs: 0,
                };
                async move { m.client.score(&params).await.map_err(|e| e.into_call()) }
            })
            .await;
        for (m, scored) in ok {
            for (&c, s) in missing[m].iter().zip(scored) {
                known[m][c] = Some((s.logprob, s.byte_length as usize));
            }
        }
    }

    /// `confident` and `cross`: every member drafts; the best draft wins.
    async fn round_drafts(&self, alive: &mut Vec<usize>, req: &GenerateParams, answer: &str, k: u32) -> Result<Step, CallError> {
        let on = alive.clone();
        let (drafts, error) =
            self.drafts(alive, &on, req, answer, DraftAsk { max_tokens: k, top: 0, deadline: self.spec.round_deadline }).await;
        if drafts.is_empty() {
            return Err(none_left(error, "no ensemble member answered"));
        }
        let spans: Vec<(usize, Span, Option<FinishReason>)> = drafts
            .iter()
            .map(|(m, d)| {
                let ends = ends(&d.done, d.tokens.len(), k);
                (*m, combine::cut(&d.tokens, &d.text, ends.is_some()), ends)
            })
            .collect();
        let winner = match self.spec.method {
            Method::Cross if spans.len() > 1 => {
                // Distinct texts to score; an empty one (the turn ends at
                // once) cannot be scored by the others: its drafter's own
                // figure stands for it.
                let mut texts: Vec<String> = Vec::new();
                for (_, s, _) in &spans {
                    if !s.text.is_empty() && !texts.contains(&s.text) {
                        texts.push(s.text.clone());
                    }
                }
                // A drafter's figure for its own draft is the draft's.
                let mut scores = vec![vec![None; texts.len()]; self.members.len()];
                for (m, s, _) in &spans {
                    if let Some(c) = texts.iter().position(|t| *t == s.text) {
                        scores[*m][c] = Some((s.logprob, s.text.len()));
                    }
                }
                let on = alive.clone();
                self.scores(alive, &on, req, answer, &texts, &mut scores).await;
                let per_byte: Vec<Vec<Option<f64>>> =
                    scores.iter().map(|row| row.iter().map(|s| s.map(|(lp, bytes)| combine::per_byte(lp, bytes))).collect()).collect();
                let weights = self.weights();
                let combined = combine::cross(&per_byte, &weights, texts.len());
                let value = |s: &Span| match texts.iter().position(|t| *t == s.text) {
                    Some(c) if combined[c].is_finite() => combined[c],
                    _ => s.per_byte(),
                };
                let values: Vec<f64> = spans.iter().map(|(_, s, _)| value(s)).collect();
                let w = combine::best(&values).unwrap_or(0);
                let mut outcome = vec![None; self.members.len()];
                for (m, s, _) in &spans {
                    outcome[*m] = Some(s.text == spans[w].1.text);
                }
                self.weights.lock().unwrap_or_else(|e| e.into_inner()).update(&outcome);
                w
            }
            _ => combine::best(&spans.iter().map(|(_, s, _)| s.per_byte()).collect::<Vec<_>>()).unwrap_or(0),
        };
        let (m, span, ends) = spans.into_iter().nth(winner).expect("the winner is one of the spans");
        Ok(Step { text: span.text, tokens: span.tokens, ends, winner: Some(m) })
    }

    /// `merge`: the first member drafts; where it is unsure, the members'
    /// probabilities of its candidate next words are mixed.
    async fn round_merge(&self, alive: &mut Vec<usize>, req: &GenerateParams, answer: &str, k: u32) -> Result<Step, CallError> {
        let drafter = alive[0];
        let (drafts, error) = self
            .drafts(alive, &[drafter], req, answer, DraftAsk { max_tokens: k, top: MERGE_CANDIDATES, deadline: self.spec.round_deadline })
            .await;
        let Some((_, d)) = drafts.into_iter().next() else {
            return Err(none_left(error, "the drafting member did not answer"));
        };
        let ends = ends(&d.done, d.tokens.len(), k);
        let whole = |d: &Draft| {
            let span = combine::cut(&d.tokens, &d.text, ends.is_some());
            Step { text: span.text, tokens: span.tokens, ends, winner: Some(drafter) }
        };
        // Each unsure position in turn: where the mixture keeps the
        // drafter's own token, the draft after it still follows from the
        // same text, so the next unsure position is looked at; where it
        // picks another word, the span ends with that word.
        let mut from = 0;
        while let Some(at) = combine::unsure_at(&d.tokens[from..], self.spec.gate).map(|rel| from + rel) {
            from = at + 1;
            let agreed = combine::text_of(&d.tokens[..at]);
            let candidates = combine::candidates(&d.tokens[at]);
            let agreed_whole = agreed.len() == d.tokens[..at].iter().map(|t| t.piece.len()).sum::<usize>();
            if d.tokens[at].piece.is_empty() || candidates.len() < 2 || !agreed_whole {
                // Unsure whether to end, nothing to choose between, or
                // inside a character: the draft stands here.
                continue;
            }
            let context = format!("{answer}{agreed}");
            // The drafter's probabilities of its own alternatives are known.
            let mut scores = vec![vec![None; candidates.len()]; self.members.len()];
            for (c, text) in candidates.iter().enumerate() {
                scores[drafter][c] = d.tokens[at].top.iter().find(|a| a.piece == text.as_bytes()).map(|a| (a.logprob, text.len()));
            }
            let on = alive.clone();
            self.scores(alive, &on, req, &context, &candidates, &mut scores).await;
            let logprobs: Vec<Vec<Option<f64>>> = scores.iter().map(|row| row.iter().map(|s| s.map(|(lp, _)| lp)).collect()).collect();
            let mixed = combine::mix(&logprobs, &Weights::equal(self.members.len()), candidates.len());
            let chosen = combine::best(&mixed).unwrap_or(0);
            if candidates[chosen].as_bytes() != &d.tokens[at].piece[..] {
                return Ok(Step { text: format!("{agreed}{}", candidates[chosen]), tokens: at as u32 + 1, ends: None, winner: None });
            }
        }
        Ok(whole(&d))
    }

    /// An answer that may call functions is one member's: calls are not
    /// mixed from spans of several. The members are asked in their order;
    /// one that fails before its first text is passed over for the next.
    async fn generate_with_tools(&self, req: GenerateParams, mut on_delta: impl FnMut(&str) + Send) -> Result<Done, CallError> {
        let mut last = None;
        for m in &self.members {
            let mut shown = 0;
            let mut on_text = |t: &str| {
                shown += t.len();
                on_delta(t);
            };
            match Runner::generate(&m.client, GenerateParams { tier: m.tier, ..req.clone() }, &mut on_text).await {
                Ok(done) => return Ok(done),
                Err(e) if shown > 0 => return Err(e.after(shown)),
                Err(e) => {
                    tracing::warn!(member = %m.name, "an ensemble member failed an answer with tools: {}; asking the next", e.message);
                    self.count(|s| s.dropped += 1);
                    if let Some(f) = &self.on_failure {
                        f(&m.name, &e);
                    }
                    last = Some(e);
                }
            }
        }
        Err(none_left(last, "no ensemble member answered"))
    }

    /// A JSON answer is never shown in parts, so it is not built span by
    /// span: every member writes the whole answer under the schema (its
    /// daemon enforces it), and the method picks one whole answer.
    async fn generate_json(&self, req: GenerateParams, mut on_delta: impl FnMut(&str) + Send) -> Result<Done, CallError> {
        let mut alive: Vec<usize> = (0..self.members.len()).collect();
        let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let rounds = max_tokens.div_ceil(self.spec.span_tokens.max(1)).max(1);
        let deadline = self.spec.round_deadline.saturating_mul(rounds);
        let on = alive.clone();
        let (drafts, error) = self.drafts(&mut alive, &on, &req, "", DraftAsk { max_tokens, top: 0, deadline }).await;
        if drafts.is_empty() {
            return Err(none_left(error, "no ensemble member answered"));
        }
        let own: Vec<f64> =
            drafts.iter().map(|(_, d)| combine::per_byte(d.tokens.iter().map(|t| t.logprob).sum(), d.done.text.len())).collect();
        let winner = if self.spec.method == Method::Confident || drafts.len() < 2 {
            combine::best(&own).unwrap_or(0)
        } else {
            let texts: Vec<String> = drafts.iter().map(|(_, d)| d.done.text.clone()).filter(|t| !t.is_empty()).collect();
            let on = alive.clone();
            let mut scores = vec![vec![None; texts.len()]; self.members.len()];
            self.scores(&mut alive, &on, &req, "", &texts, &mut scores).await;
            let per_byte: Vec<Vec<Option<f64>>> =
                scores.iter().map(|row| row.iter().map(|s| s.map(|(lp, bytes)| combine::per_byte(lp, bytes))).collect()).collect();
            let combined = combine::cross(&per_byte, &self.weights(), texts.len());
            let values: Vec<f64> = drafts
                .iter()
                .zip(&own)
                .map(|((_, d), own)| texts.iter().position(|t| *t == d.done.text).map_or(*own, |c| combined[c]))
                .collect();
            combine::best(&values).unwrap_or(0)
        };
        let (m, d) = drafts.into_iter().nth(winner).expect("the winner is one of the drafts");
        self.count(|s| {
            s.rounds += 1;
            s.bytes += d.done.text.len() as u64;
            if let Some(w) = s.wins.get_mut(m) {
                *w += 1;
            }
        });
        on_delta(&d.done.text);
        Ok(d.done)
    }
}

/// How a draft ended the answer, if it did: its turn ended or a stop
/// string came; or it made fewer tokens than asked because the context is full.
fn ends(done: &Done, made: usize, asked: u32) -> Option<FinishReason> {
    match done.finish_reason {
        FinishReason::End | FinishReason::Stop | FinishReason::ToolCalls => Some(done.finish_reason),
        FinishReason::Length if (made as u32) < asked && done.generated_tokens < asked => Some(FinishReason::Length),
        FinishReason::Length => None,
    }
}

/// One member's draft: the whole stream, with every token's log-probability.
async fn draft(client: &Client, params: &GenerateParams) -> Result<Draft, CallError> {
    let mut stream = client.generate(params).await.map_err(|e| e.into_call())?;
    let mut fold = DoneFold::new();
    let mut text = String::new();
    while let Some(ev) = stream.next().await? {
        if let Some(mut done) = fold.push(ev, |_| {}, |t, _| text.push_str(t)) {
            // The draft keeps its tokens apart; the daemon's Done has none of its own.
            let tokens = std::mem::take(&mut done.logprobs);
            return Ok(Draft { tokens, text, done });
        }
    }
    Err(CallError::new(Code::Unavailable, "the daemon closed the stream before the draft was done"))
}

impl Ensemble {
    /// The first member: what an ensemble answers for alone (embeddings,
    /// its tiers), since only answers are combined.
    fn first(&self) -> Result<&Member, CallError> {
        self.members.first().ok_or_else(|| CallError::new(Code::FailedPrecondition, "the ensemble has no members"))
    }
}

impl Runner for Ensemble {
    /// Warms every member's cache at once; answers with the first member's figures.
    async fn prefill(&self, req: PrefillParams) -> Result<Prefilled, CallError> {
        let mut alive: Vec<usize> = (0..self.members.len()).collect();
        let on = alive.clone();
        let (ok, error) = self
            .each(&mut alive, &on, self.spec.round_deadline, move |_, m: Member| {
                let params = PrefillParams { tier: m.tier, ..req.clone() };
                async move { m.client.prefill(&params).await.map_err(|e| e.into_call()) }
            })
            .await;
        ok.into_iter().next().map(|(_, p)| p).ok_or_else(|| none_left(error, "no ensemble member"))
    }

    async fn generate(&self, req: GenerateParams, mut on_delta: impl FnMut(&str) + Send) -> Result<Done, CallError> {
        if self.members.is_empty() {
            return Err(CallError::new(Code::FailedPrecondition, "the ensemble has no members"));
        }
        if matches!(req.format, Format::Json { .. }) {
            return self.generate_json(req, on_delta).await;
        }
        if req.offers_tools() {
            return self.generate_with_tools(req, on_delta).await;
        }
        let started = Instant::now();
        let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let mut alive: Vec<usize> = (0..self.members.len()).collect();
        // What the members see (a caller's answer already begun included),
        // and what this call showed.
        let mut answer = req.answer_prefix.clone();
        let mut shown = String::new();
        let mut generated = 0u32;
        let mut idle = 0u32;
        let mut last = Done::default();
        let finish = loop {
            if generated >= max_tokens {
                break FinishReason::Length;
            }
            if alive.is_empty() {
                // Every member failed within the round (a score, after the drafts).
                return Err(CallError::new(Code::Unavailable, "every member of the ensemble failed or missed the round's deadline")
                    .after(shown.len()));
            }
            if alive.len() == 1 {
                // One member left: it finishes the answer on its own, from
                // the text so far, nothing repeated or lost.
                let m = &self.members[alive[0]];
                let params = GenerateParams {
                    tier: m.tier,
                    answer_prefix: answer.clone(),
                    max_tokens: Some(max_tokens - generated),
                    logprobs: None,
                    ..req.clone()
                };
                self.count(|s| s.calls += 1);
                let stream = m.client.generate(&params).await.map_err(|e| e.into_call().after(shown.len()))?;
                let delivered = shown.len();
                let done = stream
                    .finish(|t| {
                        shown.push_str(t);
                        on_delta(t);
                    })
                    .await
                    .map_err(|e| CallError { delivered: delivered + e.delivered, ..e })?;
                generated += done.generated_tokens;
                self.count(|s| s.bytes += (shown.len() - delivered) as u64);
                last = done;
                break last.finish_reason;
            }
            let k = self.spec.span_tokens.min(max_tokens - generated).max(1);
            let step = match self.spec.method {
                Method::Confident | Method::Cross => self.round_drafts(&mut alive, &req, &answer, k).await,
                Method::Merge => self.round_merge(&mut alive, &req, &answer, k).await,
            };
            let step = match step {
                Ok(step) => step,
                // A failed drafter in `merge` leaves the next member to draft.
                Err(_) if !alive.is_empty() => continue,
                Err(e) => return Err(e.after(shown.len())),
            };
            self.count(|s| {
                s.rounds += 1;
                s.bytes += step.text.len() as u64;
                if let Some(w) = step.winner.and_then(|m| s.wins.get_mut(m)) {
                    *w += 1;
                }
            });
            if !step.text.is_empty() {
                on_delta(&step.text);
                answer.push_str(&step.text);
                shown.push_str(&step.text);
                idle = 0;
            } else {
                idle += 1;
            }
            generated += step.tokens.max(1);
            if let Some(reason) = step.ends {
                break reason;
            }
            if idle >= MAX_IDLE_ROUNDS {
                break FinishReason::End;
            }
        };
        Ok(Done {
            finish_reason: finish,
            generated_tokens: generated,
            text: shown,
            prompt_tokens: last.prompt_tokens,
            cached_tokens: last.cached_tokens,
            seed: req.sampling.seed.unwrap_or(last.seed),
            generate_us: started.elapsed().as_micros() as u64,
            ..Done::default()
        })
    }

    /// The first member's embeddings, with its model.
    async fn embed(&self, req: EmbedParams) -> Result<Embedded, CallError> {
        let m = self.first()?;
        m.client.embed(&EmbedParams { tier: m.tier, ..req }).await.map_err(|e| e.into_call())
    }

    /// The tiers of the first member's daemon.
    async fn tiers(&self) -> Result<Vec<TierStatus>, CallError> {
        self.first()?.client.tiers().await
    }
}

/// The error when no member is left to answer: the last member's, where
/// one failed, else `what`. A member whose connection broke under the call
/// (its daemon gone) is unavailable, as a member that could not be reached
/// is, whatever code the broken stream read as.
fn none_left(error: Option<CallError>, what: &str) -> CallError {
    match error {
        Some(e) if e.broken => CallError { code: Code::Unavailable, message: format!("{what}: {}", e.message), ..e },
        Some(e) => e,
        None => CallError::new(Code::Unavailable, what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_member_left_reads_as_unavailable_when_their_connections_broke() {
        let broken = CallError { broken: true, ..CallError::new(Code::Unknown, "transport error") }.after(11);
        let e = none_left(Some(broken), "no ensemble member answered");
        assert_eq!((e.code, e.delivered, e.message.as_str()), (Code::Unavailable, 11, "no ensemble member answered: transport error"));
        // A member's own answer (a refused request) stays what it said.
        let refused = CallError::new(Code::InvalidArgument, "the prompt is over the context");
        assert_eq!(none_left(Some(refused), "x").code, Code::InvalidArgument);
        assert_eq!(none_left(None, "no ensemble member").code, Code::Unavailable);
    }
}
