from openonce import ConformanceScenario, ProbeOutcome, ProbeResult, assert_conformance

assert_conformance(
    stripe_capability,
    {
        ConformanceScenario.HAPPENED: ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"stripe_id": "pi_1"}
        ),
        ConformanceScenario.YOUNG_MISS: ProbeResult(ProbeOutcome.INCONCLUSIVE),
        ConformanceScenario.MATURE_MISS: ProbeResult(ProbeOutcome.NOT_HAPPENED),
        ConformanceScenario.AMBIGUOUS: ProbeResult(ProbeOutcome.INCONCLUSIVE),
    },
)
