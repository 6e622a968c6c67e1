//! Several answers in one batch: generations of one model decode together
//! (`daemon.streams`), each with the text it gives alone.

use revis_client::wire::v1 as pb;
use revis_testkit::TestDaemon;

use crate::{Answer, ask, generate, system, user};

const COUNT: &str = "Count from one to twenty in words, separated by commas.";

/// Four requests unlike each other: plain, a stop string (cut from the plain
/// answer to [`COUNT`] by the test), log-probabilities, and a longer system prompt.
fn requests(stop: &str) -> Vec<pb::GenerateRequest> {
    vec![
        ask("Count from one to twenty in words."),
        pb::GenerateRequest { stop: vec![stop.to_owned().into_bytes().into()], ..ask(COUNT) },
        pb::GenerateRequest { logprobs: true, top_logprobs: 2, ..ask("Name some animals that live in rivers.") },
        pb::GenerateRequest {
            messages: vec![system("You answer in full sentences and never use lists."), user("Describe a lighthouse.")],
            ..ask("")
        },
    ]
}

/// What an answer streamed, as the caller saw it.
type Seen = (String, Vec<(u32, Vec<(Vec<u8>, f64)>)>);

fn seen(a: &Answer) -> Seen {
    let text = a.deltas.iter().map(|d| d.text.as_str()).collect();
    let logprobs = a.deltas.iter().map(|d| (d.tokens, d.logprobs.iter().map(|l| (l.piece.to_vec(), l.logprob)).collect())).collect();
    (text, logprobs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_greedy_answers_decoded_together_are_each_the_answer_alone() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let stop = crate::stop_from(&generate(&mut c, ask(COUNT)).await.unwrap().done.text, 4);
    let mut alone = Vec::new();
    for req in requests(&stop) {
        let a = generate(&mut c, req).await.unwrap();
        assert_eq!(a.done.batch_peak, 1, "one at a time, each is decoded alone");
        alone.push(a);
    }
    assert_eq!(alone[1].done.finish_reason, pb::FinishReason::Stop as i32, "the stop string matched: {:?}", alone[1].done.text);

    let calls: Vec<_> = requests(&stop)
        .into_iter()
        .map(|req| {
            let mut c = c.clone();
            tokio::spawn(async move { generate(&mut c, req).await.unwrap() })
        })
        .collect();
    let mut together = Vec::new();
    for call in calls {
        together.push(call.await.unwrap());
    }
    let peaks: Vec<u32> = together.iter().map(|a| a.done.batch_peak).collect();
    assert_eq!(peaks.iter().max(), Some(&4), "the four shared steps: {peaks:?}");
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(seen(b), seen(a), "request {i}: the same deltas, log-probabilities included, with others as alone");
        assert_eq!(b.done.text, a.done.text);
        assert_eq!((b.done.finish_reason, b.done.generated_tokens), (a.done.finish_reason, a.done.generated_tokens), "request {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cancelled_mid_batch_leaves_the_others_whole() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let long = || crate::long_answer(400);
    let keep = [ask("Count from one to twenty in words."), ask("Name some animals that live in rivers.")];
    let mut alone = Vec::new();
    for req in &keep {
        alone.push(generate(&mut c, req.clone()).await.unwrap().done.text);
    }

    // The long one streams; the caller leaves after its first text.
    let mut stream = c.wire().inference.generate(long()).await.unwrap().into_inner();
    let others: Vec<_> = keep
        .iter()
        .map(|req| {
            let (mut c, req) = (c.clone(), req.clone());
            tokio::spawn(async move { generate(&mut c, req).await.unwrap().done })
        })
        .collect();
    loop {
        let e = stream.message().await.unwrap().expect("the long answer streams");
        if matches!(e.event, Some(pb::generate_event::Event::Delta(_))) {
            break;
        }
    }
    drop(stream);
    for (i, other) in others.into_iter().enumerate() {
        let done = other.await.unwrap();
        assert_eq!(done.text, alone[i], "request {i} lost nothing when the long answer beside it was cancelled");
    }
    // The cancelled one's sequence is free again: a fourth answer runs.
    assert_eq!(generate(&mut c, keep[0].clone()).await.unwrap().done.text, alone[0]);
}

/// Two conversations prefilled in turn (two windows, two clients) each keep
/// their prefix on a sequence of their own: neither evicts the other, so
/// each answer reuses its whole prefill.
#[tokio::test]
async fn two_prefilled_conversations_each_keep_their_own_prefix() {
    let d = TestDaemon::new().daemon("cache_slots = 0").start();
    let mut c = d.client().await;
    let history = |topic: &str| {
        vec![
            system(&format!("You are a guide who only talks about {topic}. {}", "Keep every answer short. ".repeat(8))),
            user("Tell me one fact."),
            crate::message(pb::Role::Assistant, "Here is one."),
        ]
    };
    let mut prefilled = Vec::new();
    for topic in ["rivers", "mountains"] {
        let req = pb::PrefillRequest { messages: history(topic), ..Default::default() };
        prefilled.push(c.wire().inference.prefill(req).await.unwrap().into_inner().prompt_tokens);
    }
    for (topic, prefilled) in ["rivers", "mountains"].into_iter().zip(prefilled) {
        let mut messages = history(topic);
        messages.push(user("And another?"));
        let done = generate(&mut c, pb::GenerateRequest { messages, max_tokens: 8, ..ask("") }).await.unwrap().done;
        // No saved prefixes (cache_slots = 0): one sequence would hold only the last prefill.
        assert_eq!(done.cached_tokens, prefilled, "{topic}: its whole prefill was reused");
    }
}

/// A prompt of several batches dropped by its caller while it joins the
/// engine frees its sequence: the four answers that follow decode together
/// (a sequence kept would leave three places), each as it is alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_dropped_while_it_joins_frees_its_sequence() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let keep = ask("Count from one to twenty in words.");
    let alone = generate(&mut c, keep.clone()).await.unwrap().done.text;

    // About 1,500 tokens (a number is about 4 tokens here): three prompt
    // batches, seconds of work on 2 cores.
    let numbers: Vec<String> = (1..=380).map(|i| i.to_string()).collect();
    let joining = ask(&format!("Add up these numbers: {}", numbers.join(" ")));
    let stream = c.wire().inference.generate(joining).await.unwrap().into_inner();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let s = c.status().await.unwrap();
        if s.busy && s.queue_depth == 0 {
            break; // the engine has it: its prompt is joining
        }
        assert!(std::time::Instant::now() < deadline, "the long prompt never reached the engine: {s:?}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await; // polled, not spun
    }
    drop(stream);

    let calls: Vec<_> = (0..4)
        .map(|_| {
            let (mut c, req) = (c.clone(), keep.clone());
            tokio::spawn(async move { generate(&mut c, req).await.unwrap().done })
        })
        .collect();
    let mut peaks = Vec::new();
    for call in calls {
        let done = call.await.unwrap();
        assert_eq!(done.text, alone, "an answer beside the others is the one it gives alone");
        peaks.push(done.batch_peak);
    }
    assert_eq!(peaks.iter().max(), Some(&4), "the dropped prompt's sequence is free again: {peaks:?}");
}

/// A prompt of several batches joins between the steps of an answer
/// already running: that answer keeps streaming while the prompt is
/// evaluated, batch by batch, instead of standing still for all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_joins_batch_by_batch_while_an_answer_streams() {
    use std::time::{Duration, Instant};
    let d = TestDaemon::new().start();
    let c = d.client().await;
    let mut running = c.wire().inference.generate(crate::long_answer(400)).await.unwrap().into_inner();
    // The running answer has begun streaming.
    loop {
        let e = running.message().await.unwrap().expect("the long answer streams");
        if matches!(e.event, Some(pb::generate_event::Event::Delta(_))) {
            break;
        }
    }
    let numbers: Vec<String> = (1..=380).map(|i| i.to_string()).collect();
    let joining = ask(&format!("Add up these numbers: {}", numbers.join(" ")));
    let (first_tx, mut first_rx) = tokio::sync::oneshot::channel();
    let joiner = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut stream = c.wire().inference.generate(joining).await.unwrap().into_inner();
            let mut first = Some(first_tx);
            while let Some(e) = stream.message().await.unwrap() {
                match e.event {
                    Some(pb::generate_event::Event::Delta(_)) => {
                        if let Some(tx) = first.take() {
                            let _ = tx.send(Instant::now());
                        }
                    }
                    Some(pb::generate_event::Event::Done(done)) => return done,
                    _ => {}
                }
            }
            panic!("no Done");
        })
    };
    // When the running answer's deltas came, until the joiner's first token.
    let mut seen = Vec::new();
    let first = loop {
        tokio::select! {
            biased;
            first = &mut first_rx => break first.unwrap(),
            e = running.message() => {
                let e = e.unwrap().expect("the long answer is still running");
                if matches!(e.event, Some(pb::generate_event::Event::Delta(_))) {
                    seen.push(Instant::now());
                }
            }
        }
    };
    let done = joiner.await.unwrap();
    let batches = done.prompt_tokens.div_ceil(512);
    assert!(batches >= 3, "the prompt is {} tokens, {batches} batches", done.prompt_tokens);
    // Evaluated in one go, the prompt would hold the running answer still
    // for all its time; joining batch by batch, the answer has a step
    // after each batch, so it streams in the second half of that time too.
    let half = Duration::from_micros(done.prompt_us / 2);
    let late = seen.iter().filter(|&&t| t + half >= first).count();
    assert!(
        late > 0,
        "the running answer streamed nothing in the last {half:?} of a prompt of {batches} batches: it waited for the whole prompt"
    );
}
