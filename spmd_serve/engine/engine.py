"""The step loop.  Rank 0: take new requests → schedule → broadcast the plan → run its shard →
sample → update → publish outputs.  Other ranks: receive the plan → run their shard.  Same
program on every rank; which loop runs is chosen once at start-up (DESIGN §1–2).

What belongs to one request fails that request only: its parameters are validated again at
admission (engine/admission.py, which also holds a request back while its grammar compiles), and
a request whose sampling fails (`SampledStep.failed`) ends with an error output while the step goes
on for every other one.  An exception anywhere else in the step (the graphs, the collectives, the
scheduler's own state) is not a request's and ends the job.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import numpy.typing as npt

from spmd_serve.engine import prompt_logprobs
from spmd_serve.engine.admission import HELD_WAIT_S, Admission
from spmd_serve.engine.client import AbortCommand, ControlCommand, VocabCommand
from spmd_serve.engine.control import Controls
from spmd_serve.engine.drain import DEFAULT_DRAIN_TIMEOUT_S, Drain
from spmd_serve.engine.interfaces import FrontEnd, PlanComm, Runner
from spmd_serve.engine.metrics import EngineMetrics
from spmd_serve.engine.outputs import RequestOutput
from spmd_serve.engine.plan_builder import build_plan
from spmd_serve.engine.sampler import SampledStep, Sampler
from spmd_serve.engine.speculative import Speculator
from spmd_serve.engine.step_stats import StepStats
from spmd_serve.protocol import RUN, RUN_DRAFT, SHUTDOWN, StepPlan
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import Scheduler, SchedulerConfig, SchedulerOutput

log = logging.getLogger("spmd_serve.engine")
IDLE_WAIT_S = 0.5  # rank 0 sleeps on the command queue (no MPI) when there is nothing to do


class Engine:
    """Rank 0's scheduler-driven loop; `runner.execute` includes the other ranks via the plan."""

    def __init__(
        self,
        sched_cfg: SchedulerConfig,
        comm: PlanComm,
        runner: Runner,
        client: FrontEnd,
        eos_token_ids: frozenset[int],
        log_every: int = 0,
        metrics: EngineMetrics | None = None,
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
        sampler: Sampler | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        self.scheduler = Scheduler(sched_cfg)
        self.comm, self.runner, self.client = comm, runner, client
        self.sampler = sampler if sampler is not None else Sampler()
        self.speculator = speculator  # SPECULATE_METHOD: drafts proposed before each schedule
        if speculator is not None:
            self.sampler.draft_probs = speculator.proposer.draft_probs
        self.block_size = sched_cfg.block_size
        self.eos = eos_token_ids
        self.admission = Admission(self.scheduler, eos_token_ids, client.wake)
        self.stats = StepStats(log_every=log_every, runner=runner.timings)
        self.metrics = metrics if metrics is not None else EngineMetrics()
        self.metrics.watch_steps(self.stats)  # step phases in /metrics, read at scrape time
        self.metrics.update_gauges(self.scheduler)  # a scrape before the first turn reads the pool
        client.on_handoff = self.stats.record_handoff
        self.controls = Controls(self.scheduler.block_manager, self.admission, self.metrics, client.publish)
        # Stopping is two-staged: stop_event (first SIGTERM) drains — nothing new is admitted (the
        # client answers 503 once `draining` is set), in-flight requests run on until they finish
        # or drain_timeout_s passes; abort_event (second SIGTERM) ends the drain at once.
        self.stop_event = threading.Event()
        self.abort_event = threading.Event()
        self.drain = Drain(drain_timeout_s)
        self.step_id = 0
        self.num_preemptions = 0
        self._empty_steps = 0

    # ---- commands from the front end ------------------------------------------------------
    def _apply_commands(self) -> None:
        errors: list[RequestOutput] = []
        for cmd in self.client.take_commands():
            if isinstance(cmd, AbortCommand):
                req = self.admission.abort(cmd.req_id)
                self.metrics.on_abort(req, cmd.requested_at, cmd.reason)
                if req is not None and cmd.reason != "stop":  # a client gone: a line, as vLLM's "Aborted request"
                    log.info("aborted request %s (%s), %d tokens out", cmd.req_id, cmd.reason, req.num_output_tokens)
                continue
            if isinstance(cmd, VocabCommand):
                self.admission.read_vocabulary(cmd.token_bytes)
                continue
            if isinstance(cmd, ControlCommand):
                self.controls.answer(cmd)
                continue
            err = self.admission.admit(cmd)
            if err is not None:
                errors.append(err)
        released = self.admission.release()  # (a request held to a grammar only once the vocabulary is made)
        if self.sampler.json_vocab is None:  # (made on the admission's helper thread)
            self.sampler.json_vocab = self.admission.vocabulary()
        self.client.publish(errors + released)

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            self.client.heartbeat = time.monotonic()
            self._apply_commands()
            self.metrics.update_gauges(self.scheduler, len(self.admission.held))  # every turn: current when idle too
            if self.stop_event.is_set() and self.drain.done(self.admission.in_flight(), self.abort_event.is_set()):
                break
            if self.scheduler.has_unfinished():
                self.step()
                if self._empty_steps:  # nothing schedulable: only a new command can change that
                    self.client.wait_for_work(0.01)
            else:  # (a grammar compiling wakes it when made; the short wait bounds a wake-up missed)
                self.client.wait_for_work(HELD_WAIT_S if self.admission.held else IDLE_WAIT_S)
        self._shutdown()

    def step(self) -> list[Request]:
        """One step on rank 0, timed by phase; returns the requests that got a token."""
        st = self.stats.start()
        with st.phase("schedule"):
            out = self._schedule()
        if out is None:
            return []
        with st.phase("broadcast"):
            plan = self._broadcast(out)
        with st.phase("execute"):
            logits = self._execute(plan)
        with st.phase("sample"):
            sampled = self.sampler.sample(out, logits)
        with st.phase("update"):
            done = self._update(out, sampled)
        st.end_step(out.num_tokens, sum(r.num_new_tokens for r in done), sampled.num_draft, sampled.num_accepted)
        return self._publish(done, sampled)  # last: a client holding its answer sees this step counted

    def _schedule(self) -> SchedulerOutput | None:
        """This step's scheduler decision (after the proposer's drafts); None when nothing can run."""
        if self.speculator is not None:
            with self.stats.phase("draft"):  # a part of "schedule", as the runner's parts are of "execute"
                self.speculator.propose(self.scheduler.running)
        out = self.scheduler.schedule()
        if out.is_empty:
            self._empty_steps += 1
            if self._empty_steps % 500 == 0:  # ~5 s of unfinished work that cannot be scheduled: say why
                self._report_no_progress()
            return None
        self._empty_steps = 0
        self.num_preemptions += len(out.preempted)
        self.metrics.on_schedule(out)
        return out

    def _broadcast(self, out: SchedulerOutput) -> StepPlan:
        """The decision as the StepPlan every rank runs, sent to the other ranks."""
        self.step_id += 1
        plan = build_plan(out, self.step_id, self.block_size)
        self.comm.send_plan(plan)
        return plan

    def _execute(self, plan: StepPlan) -> npt.NDArray[np.float32]:
        """This rank's shard of the plan (the others run theirs from the broadcast); [R, V] logits,
        this step's sequences in order (a sequence verifying d drafts has 1 + d rows).  `busy_since`
        tells health a long step is not a hang."""
        self.client.busy_since = time.monotonic()
        try:
            logits = self.runner.execute(plan)
            assert logits is not None, "rank 0's runner returns the logits"
            self.metrics.on_model_stats(self.runner.take_stats())
            return logits
        finally:
            self.client.busy_since = None

    def _update(self, out: SchedulerOutput, sampled: SampledStep) -> list[Request]:
        """End the requests whose sampling failed, append the sampled tokens and apply the stop
        rules (metrics recorded)."""
        self._fail(sampled.failed)
        for s in out.seqs:  # before the update: a request it finishes reports them
            s.request.prompt_logprobs += sampled.prompt_logprobs.get(s.request.req_id, ())
        done = self.scheduler.update(out, sampled.token_by_request())
        self.metrics.on_update(done)
        if self.speculator is not None:
            self._record_verdicts(self.speculator, out, sampled)
            with self.stats.phase("draft"):  # a proposer that follows every step (mtp) sees it: part of "update"
                self.speculator.on_step(out)
        return done

    def _record_verdicts(self, spec: Speculator, out: SchedulerOutput, sampled: SampledStep) -> None:
        """The step's drafts verified and accepted: per request for the per-step rule, per method
        for the metrics."""
        got = sampled.token_by_request()  # a request whose sampling failed accepted nothing
        verdicts = [(s.request, s.num_draft, len(got.get(s.request.req_id, [0])) - 1) for s in out.seqs if s.num_draft]
        spec.on_verdicts(verdicts)
        self.metrics.on_spec(spec.method, sampled.num_verifying, sampled.num_draft, sampled.num_accepted)

    def _fail(self, failed: dict[str, str]) -> None:
        """End the requests whose own sampling failed, with an error output; the step and every
        other request carry on (the scheduler skips aborted requests in its update)."""
        if not failed:
            return
        for req_id, why in failed.items():
            log.error("request %s failed: %s", req_id, why)
            self.metrics.on_abort(self.scheduler.abort_request(req_id), time.monotonic(), "error")
        self.client.publish([RequestOutput.error(req_id, 500, why) for req_id, why in failed.items()])

    def _publish(self, done: list[Request], sampled: SampledStep) -> list[Request]:
        """Stream one output per request that got a token (waits for the IO side's hand-off)."""
        self.client.publish(
            [RequestOutput.step(r, sampled.logprobs.get(r.req_id), prompt_logprobs.once(r)) for r in done]
        )
        return done

    def _report_no_progress(self) -> None:
        sch = self.scheduler
        try:
            sch.check_invariants()
            broken = "scheduler invariants hold"
        except AssertionError as e:
            broken = f"scheduler invariant broken: {e}"
        log.warning(
            "no progress for %d schedules (%s): running=%s waiting=%s free blocks %d/%d",
            self._empty_steps,
            broken,
            [(r.req_id, r.num_computed_tokens, r.num_tokens, len(r.block_ids)) for r in sch.running],
            [(r.req_id, r.status.name, r.num_tokens, len(r.block_ids)) for r in list(sch.waiting)[:8]],
            sch.block_manager.num_free_blocks,
            sch.block_manager.num_blocks,
        )

    def warm_up(self, prompt_ids: list[int], max_tokens: int = 4) -> None:
        """USE_WARMUP=1: one short greedy request through every rank before reporting ready, so
        the first user request does not pay for graph initialisation and first-touch of memory."""
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.scheduler.add_request(Request("__warmup__", prompt_ids, params))
        with self.metrics.paused():  # not user traffic
            while self.scheduler.has_unfinished():
                self.step()

    def _shutdown(self) -> None:
        """Fail whatever is still in flight with an error frame, then stop every rank."""
        pending = self.admission.in_flight()
        for req in pending:
            self.admission.abort(req.req_id)
        self.admission.close()
        msg = self.drain.error_message()
        self.client.publish([RequestOutput.error(r.req_id, 503, msg) for r in pending])
        self.comm.send_plan(StepPlan.shutdown(self.step_id + 1))
        bm = self.scheduler.block_manager
        log.info(
            "engine stopped: kv blocks free %d/%d, preemptions %d; %s",
            bm.num_free_blocks,
            bm.num_blocks,
            self.num_preemptions,
            self.stats.summary(),
        )


def worker_loop(comm: PlanComm, runner: Runner, draft_runner: Runner | None = None) -> None:
    """Ranks 1..N-1: execute plans until SHUTDOWN, RUN_DRAFT ones on the draft runner (speculative
    decoding's second model).  Stateless: the plan says everything."""
    runners = {RUN: runner} if draft_runner is None else {RUN: runner, RUN_DRAFT: draft_runner}
    while (plan := comm.recv_plan()).kind != SHUTDOWN:
        runners[plan.kind].execute(plan)
