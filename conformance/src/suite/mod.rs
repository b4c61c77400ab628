//! What the suite runs against ([`Target`], [`Profile`]), what it concludes ([`Verdict`],
//! [`CaseResult`], [`Report`]) and the runner ([`run`]).

mod profile;
mod result;
mod target;

pub use profile::Profile;
pub use result::{
    CaseResult, Confidence, Missed, Progress, Report, Summary, Verdict, EXIT_FAIL, EXIT_HARNESS,
    EXIT_UNSAFE, EXIT_USAGE,
};
pub use target::{KeyKind, KeyStyle, Target, DEFAULT_BODY};

use crate::cases::{self, Case, Check, Ctx, Miss, Waiting};
use crate::http::{HarnessError, Http, Log};
use crate::server::Fault;
use std::time::Instant;

/// The cases whose IDs start with any of `prefixes` (all cases when empty), in suite order.
pub fn select(prefixes: &[String]) -> Result<Vec<&'static Case>, String> {
    let all = cases::all();
    if prefixes.is_empty() {
        return Ok(all.to_vec());
    }
    for p in prefixes {
        if !all.iter().any(|c| c.id.starts_with(p.as_str())) {
            return Err(format!("no case ID starts with {p:?} (see --list)"));
        }
    }
    Ok(all
        .iter()
        .filter(|c| prefixes.iter().any(|p| c.id.starts_with(p.as_str())))
        .copied()
        .collect())
}

/// The client for `target`: TLS is set up when the endpoint or the count oracle is
/// `https://`.
pub fn client(target: &Target) -> Result<Http, HarnessError> {
    let https = std::iter::once(&target.url)
        .chain(&target.count_url)
        .any(|u| u.scheme() == "https");
    let tls = if https {
        Some(crate::tls::client_config(&target.trust).map_err(HarnessError::Usage)?)
    } else {
        None
    };
    Ok(Http::new(target.timeout, target.max_response_bytes, tls))
}

/// Runs `cases` against `target`, one after the other (the count oracle is global, so
/// cases never overlap), reporting progress as it goes. The report carries no credential
/// unless `target.show_secrets`.
pub async fn run(
    target: &Target,
    cases: &[&'static Case],
    embedded: Option<Option<Fault>>,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<Report, HarnessError> {
    let lane = Lane {
        target: target.clone(),
        cases: cases.to_vec(),
    };
    run_lanes(vec![lane], embedded, progress).await
}

/// Cases that run one after the other against one target.
#[derive(Clone, Debug)]
pub struct Lane {
    /// Where they are sent (with its own count oracle).
    pub target: Target,
    /// The cases, in suite order.
    pub cases: Vec<&'static Case>,
}

/// What a lane reports to the run.
enum LaneEvent {
    Started(usize, &'static Case),
    Waiting(&'static Case, Waiting),
    Finished(usize, Box<CaseResult>),
}

/// Runs `lanes` side by side, the cases of each one after the other; the report lists
/// every case in suite order, for the first lane's target. Lanes must not share a count
/// oracle (an execution in one would be counted in another), and a case runs in one lane
/// only.
pub async fn run_lanes(
    lanes: Vec<Lane>,
    embedded: Option<Option<Fault>>,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<Report, HarnessError> {
    let started = Instant::now();
    let Some(target) = lanes.first().map(|l| l.target.clone()) else {
        return Err(HarnessError::Usage("no lane to run".into()));
    };
    let mut order: Vec<&'static Case> =
        lanes.iter().flat_map(|l| l.cases.iter().copied()).collect();
    let all = cases::all();
    order.sort_by_key(|c| all.iter().position(|a| std::ptr::eq(*a, *c)));
    if order.windows(2).any(|w| std::ptr::eq(w[0], w[1])) {
        return Err(HarnessError::Usage(
            "a case is in more than one lane".into(),
        ));
    }
    let total = order.len();
    let index_of = |case: &Case| {
        order
            .iter()
            .position(|c| std::ptr::eq(*c, case))
            .unwrap_or(0)
    };
    let (events, mut received) = tokio::sync::mpsc::unbounded_channel();
    let mut running = tokio::task::JoinSet::new();
    for lane in lanes {
        let http = client(&lane.target)?;
        let cases: Vec<(usize, &'static Case)> =
            lane.cases.iter().map(|c| (index_of(c), *c)).collect();
        let events = events.clone();
        running.spawn(async move {
            for (i, case) in cases {
                let _ = events.send(LaneEvent::Started(i, case));
                let mut forward = |p: Progress<'_>| {
                    if let Progress::Waiting { wait, .. } = p {
                        let _ = events.send(LaneEvent::Waiting(case, wait.clone()));
                    }
                };
                let result = run_case(&lane.target, &http, case, &mut forward).await;
                let _ = events.send(LaneEvent::Finished(i, Box::new(result)));
            }
        });
    }
    drop(events);
    let mut results: Vec<Option<CaseResult>> = (0..total).map(|_| None).collect();
    let mut reported = 0;
    while let Some(event) = received.recv().await {
        match event {
            LaneEvent::Started(i, case) => progress(Progress::Started {
                index: i + 1,
                total,
                case,
            }),
            LaneEvent::Waiting(case, wait) => progress(Progress::Waiting { case, wait: &wait }),
            LaneEvent::Finished(i, result) => {
                results[i] = Some(*result);
                // Reported in suite order: a case finished early in one lane waits for
                // the earlier cases of the others.
                while let Some(Some(done)) = results.get(reported) {
                    reported += 1;
                    progress(Progress::Finished {
                        index: reported,
                        total,
                        result: done,
                    });
                }
            }
        }
    }
    while let Some(done) = running.join_next().await {
        if let Err(e) = done {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }
    // Every lane ran to its end (a panic is raised above), so every case has its result.
    let results: Vec<CaseResult> = results.into_iter().flatten().collect();
    debug_assert_eq!(results.len(), total);
    let mut summary = Summary::default();
    for r in &results {
        match r.verdict {
            Verdict::Pass => summary.pass += 1,
            Verdict::NonStrict => summary.non_strict += 1,
            Verdict::Fail => summary.fail += 1,
            Verdict::Unsafe => summary.unsafe_ += 1,
            Verdict::Leak => summary.leak += 1,
            Verdict::Skip => summary.skip += 1,
            Verdict::Error => summary.error += 1,
        }
    }
    let mut report = Report {
        tool: "idem-conformance",
        version: env!("CARGO_PKG_VERSION"),
        target: target.url.to_string(),
        embedded: embedded.is_some(),
        fault: embedded.flatten(),
        profile: target.profile.clone(),
        strict: target.strict,
        tls: (target.url.scheme() == "https").then(|| target.trust.describe()),
        duration_ms: crate::http::ms(started.elapsed()),
        summary,
        exit_code: Report::compute_exit_code(&results),
        options: target.options(),
        cases: results,
    };
    if !target.show_secrets {
        crate::secrets::Redactor::for_target(&target).report(&mut report);
    }
    Ok(report)
}

async fn run_case(
    target: &Target,
    http: &Http,
    case: &'static Case,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> CaseResult {
    let (tx, mut waits) = tokio::sync::mpsc::unbounded_channel();
    let ctx = Ctx::new(target, http, Log::new(), Some(tx));
    if let Some(why) = kind_mismatch(target.key_kind, case) {
        return grade(target, case, &ctx, Ok(Check::Skip(why)));
    }
    let outcome = {
        let running = case.run(&ctx);
        tokio::pin!(running);
        loop {
            tokio::select! {
                outcome = &mut running => break outcome,
                Some(wait) = waits.recv() => progress(Progress::Waiting { case, wait: &wait }),
            }
        }
    };
    grade(target, case, &ctx, outcome)
}

/// Why `case` does not apply to an endpoint of `kind`, if it does not.
fn kind_mismatch(kind: KeyKind, case: &Case) -> Option<String> {
    match (KeyKind::of_section(case.section()), kind) {
        (None, KeyKind::Opaque) => None,
        (None, k) => Some(format!(
            "the endpoint takes {} keys (--key-kind); the generic cases need an endpoint with opaque keys",
            k.section().unwrap_or("other")
        )),
        (Some(f), k) if f == k => None,
        (Some(f), _) => Some(format!(
            "needs --key-kind {} and an endpoint with those keys",
            f.section().unwrap_or("")
        )),
    }
}

/// The verdict of a case: the worst of its end and of every miss it recorded, each miss
/// graded by its requirement's level under the profile.
fn grade(
    target: &Target,
    case: &'static Case,
    ctx: &Ctx<'_>,
    outcome: Result<Check, HarnessError>,
) -> CaseResult {
    let profile = target.profile.levels;
    let mut result = CaseResult {
        id: case.id.to_owned(),
        section: case.section().to_owned(),
        level: case.level(profile),
        requirement: case.requirement.to_owned(),
        requirement_text: case.requirement_text().to_owned(),
        title: case.title.to_owned(),
        verdict: Verdict::Pass,
        confidence: None,
        reason: None,
        expected: None,
        observed: None,
        missed: Vec::new(),
        notes: Vec::new(),
        duration_ms: crate::http::ms(ctx.log.elapsed()),
        exchanges: Vec::new(),
        waits: Vec::new(),
        rounds: Vec::new(),
    };
    let mut misses = ctx.take_misses();
    match outcome {
        Ok(Check::Pass(confidence, why)) => {
            result.confidence = Some(confidence);
            result.reason = Some(why);
        }
        Ok(Check::Miss(m)) => misses.push(m),
        Ok(Check::Safety(breach)) => {
            // Graded the same under every profile, whatever the level of the case's own
            // requirement: the spec names the requirement each breach misses.
            let requirement = breach
                .requirement
                .unwrap_or_else(|| breach.kind.requirement());
            result.verdict = breach.kind.verdict();
            result.confidence = Some(breach.confidence);
            result.reason = Some(breach.why);
            result.expected = Some(breach.expected.clone());
            result.observed = Some(breach.observed.clone());
            result.missed.push(Missed {
                requirement: requirement.to_owned(),
                level: cases::level(requirement, profile),
                verdict: result.verdict,
                expected: breach.expected,
                observed: breach.observed,
            });
        }
        Ok(Check::Skip(why)) => {
            result.verdict = Verdict::Skip;
            result.reason = Some(why);
        }
        Err(e) => {
            result.verdict = Verdict::Error;
            result.reason = Some(e.to_string());
        }
    }
    let mut accepted = Vec::new();
    for Miss {
        requirement,
        expected,
        observed,
    } in misses
    {
        let requirement = requirement.unwrap_or(case.requirement);
        let level = cases::level(requirement, profile);
        let verdict = Verdict::for_miss(level, target.strict);
        if verdict == Verdict::Pass {
            accepted.push(format!(
                "accepted under the {} profile ({requirement} is {}): {observed}",
                target.profile.name,
                level.as_str()
            ));
        } else if verdict.rank() > result.verdict.rank() {
            result.verdict = verdict;
            result.expected = Some(expected.clone());
            result.observed = Some(observed.clone());
        }
        result.missed.push(Missed {
            requirement: requirement.to_owned(),
            level,
            verdict,
            expected,
            observed,
        });
    }
    if !accepted.is_empty() && result.verdict == Verdict::Pass {
        let seen = result.reason.take();
        result.reason = Some(
            accepted
                .into_iter()
                .chain(seen)
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    result.notes = ctx.take_notes();
    let logged = ctx.log.take();
    result.exchanges = logged.exchanges;
    result.waits = logged.waits;
    result.rounds = logged.rounds;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_spec::Level;
    use url::Url;

    #[test]
    fn profiles_parse() {
        assert_eq!(Profile::parse("ietf"), Ok(Profile::ietf()));
        let stripe = Profile::parse("stripe").expect("stripe");
        assert!(!stripe.keys_required);
        assert_eq!(
            (stripe.bad_key, stripe.conflict, stripe.mismatch),
            (400, 409, 400)
        );
        let custom = Profile::parse("400/409/400").expect("codes");
        assert_eq!((custom.conflict, custom.mismatch), (409, 400));
        assert!(custom.keys_required);
        for bad in [
            "",
            "400/409",
            "400/409/422/500",
            "4OO/409/422",
            "99/409/422",
            "ietf2",
        ] {
            assert!(Profile::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn selection_by_prefix_keeps_suite_order() {
        let ids = |p: &[&str]| {
            select(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map(|cs| cs.iter().map(|c| c.id).collect::<Vec<_>>())
        };
        assert_eq!(
            ids(&["keys/3", "concurrent"]).expect("known"),
            ["concurrent/1", "concurrent/2", "keys/3"]
        );
        assert_eq!(ids(&[]).expect("all").len(), cases::all().len());
        assert!(ids(&["nope"]).is_err());
    }

    #[test]
    fn exit_codes_rank_unsafe_over_fail_over_error() {
        let case = |v: Verdict| CaseResult {
            id: "x/1".into(),
            section: "x".into(),
            level: Level::Must,
            requirement: "IDEM-EXEC-1".into(),
            requirement_text: String::new(),
            title: String::new(),
            verdict: v,
            confidence: None,
            reason: None,
            expected: None,
            observed: None,
            missed: Vec::new(),
            notes: Vec::new(),
            duration_ms: 0.0,
            exchanges: Vec::new(),
            waits: Vec::new(),
            rounds: Vec::new(),
        };
        let code = |vs: &[Verdict]| {
            Report::compute_exit_code(&vs.iter().map(|v| case(*v)).collect::<Vec<_>>())
        };
        assert_eq!(code(&[Verdict::Pass, Verdict::Skip, Verdict::NonStrict]), 0);
        assert_eq!(code(&[Verdict::Pass, Verdict::Error]), EXIT_HARNESS);
        assert_eq!(code(&[Verdict::Error, Verdict::Fail]), 1);
        assert_eq!(code(&[Verdict::Fail, Verdict::Unsafe, Verdict::Error]), 2);
    }

    /// Grades `outcome` of case `id` (with `soft` misses recorded on the way) under
    /// `profile`.
    fn graded(
        id: &str,
        profile: Profile,
        strict: bool,
        soft: &[&'static str],
        outcome: Result<Check, HarnessError>,
    ) -> CaseResult {
        let mut target = Target::new(Url::parse("http://127.0.0.1:1/").expect("url"));
        target.profile = profile;
        target.strict = strict;
        let http = client(&target).expect("client");
        let ctx = Ctx::new(&target, &http, Log::new(), None);
        for r in soft {
            ctx.miss(r, "expected", format!("soft miss of {r}"));
        }
        let case = cases::all()
            .iter()
            .find(|c| c.id == id)
            .expect("case exists");
        grade(&target, case, &ctx, outcome)
    }

    fn own_miss() -> Result<Check, HarnessError> {
        Ok(cases::fail("a 5xx is not stored", "the 500 was replayed"))
    }

    #[test]
    fn a_miss_is_graded_by_its_level_under_the_profile() {
        // errors/2 cites IDEM-OUT-4: MAY under ietf and stripe, MUST under idem.
        for p in [Profile::ietf(), Profile::stripe()] {
            let r = graded("errors/2", p.clone(), true, &[], own_miss());
            assert_eq!(r.verdict, Verdict::Pass, "{}", p.name);
            let reason = r.reason.expect("the accepted outcome is named");
            assert!(
                reason.contains("accepted under the")
                    && reason.contains("IDEM-OUT-4 is MAY")
                    && reason.contains("the 500 was replayed"),
                "{reason}"
            );
            assert_eq!(r.missed.len(), 1);
        }
        let r = graded("errors/2", Profile::idem(), false, &[], own_miss());
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.observed.as_deref(), Some("the 500 was replayed"));
        assert_eq!(r.level, Level::Must);
    }

    #[test]
    fn a_should_miss_is_non_strict_unless_strict_and_the_worst_miss_decides() {
        // concurrent/2 cites IDEM-CONC-3 (Retry-After): SHOULD under ietf, MUST under idem.
        let pass = || Ok(Check::Pass(Confidence::High, "ok".into()));
        let r = graded(
            "concurrent/2",
            Profile::ietf(),
            false,
            &["IDEM-CONC-3"],
            pass(),
        );
        assert_eq!(r.verdict, Verdict::NonStrict);
        let r = graded(
            "concurrent/2",
            Profile::ietf(),
            true,
            &["IDEM-CONC-3"],
            pass(),
        );
        assert_eq!(r.verdict, Verdict::Fail);
        let r = graded(
            "concurrent/2",
            Profile::idem(),
            false,
            &["IDEM-CONC-3"],
            pass(),
        );
        assert_eq!(r.verdict, Verdict::Fail);
        // A SHOULD miss of the status code does not hide a MUST miss recorded with it.
        let r = graded(
            "replay/1",
            Profile::ietf(),
            false,
            &["IDEM-HTTP-1"],
            Ok(cases::fail("the same body", "another body")),
        );
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.observed.as_deref(), Some("another body"));
        assert_eq!(r.missed.len(), 2);
        // Unsafe stays unsafe whatever else was missed; a harness error stays an error
        // unless a miss is a failure.
        let r = graded(
            "replay/1",
            Profile::ietf(),
            false,
            &["IDEM-HTTP-1"],
            Ok(cases::unsafe_("once", "twice")),
        );
        assert_eq!(r.verdict, Verdict::Unsafe);
        let err = || Err(HarnessError::Timeout("x".into()));
        assert_eq!(
            graded("replay/1", Profile::ietf(), false, &["IDEM-HTTP-1"], err()).verdict,
            Verdict::Error
        );
        assert_eq!(
            graded(
                "replay/1",
                Profile::ietf(),
                false,
                &["IDEM-REPLAY-1"],
                err()
            )
            .verdict,
            Verdict::Fail
        );
    }
}
