"""MirrorRecord builders shared by the canary tests."""

from kvmesh.runtime.pb import common_pb2, events_pb2


def mirror_record(request_id="r1", prompt=(1, 2, 3), output=(4, 5, 6), ttft_s=0.1, tpot_s=0.01, error="", seed=7,
                  max_tokens=3):
    return events_pb2.MirrorRecord(
        request_id=request_id,
        model="tiny",
        prompt_token_ids=list(prompt),
        sampling=common_pb2.SamplingParams(temperature=0.0, top_p=1.0, seed=seed, max_tokens=max_tokens),
        output_token_ids=list(output),
        finish_reason="length",
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        error=error,
    )
