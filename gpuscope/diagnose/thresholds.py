"""Every number the diagnosis decides with, named, with where its value comes from (the reduction's are in
``reduce/thresholds.py``).

Change a value here and the tests that pin its behaviour tell you what moved.
"""

from __future__ import annotations

# -- the verdict's footing --------------------------------------------------------------------------------
EVALUATION_WORTH_SAYING = 0.1
"""Evaluation passes left out of the step figures get a line in the verdict's evidence where they took this share
of the steady steps' time or more: the run's time went there too, and the figures do not show it. The line names
the loader they waited on where that wait is ``EVALUATION_LOADING_WORTH_SAYING`` of their time or more."""
EVALUATION_LOADING_WORTH_SAYING = 0.25
"""...the share of the evaluation passes' time waiting on their loader from which that line names the loader."""

MIN_STEADY_STEPS = 5
"""Fewer steady-state steps than this cut the verdict's confidence in proportion (a median of four is not a
measurement; a run of a few long steps has no more); none at all, the profiled steps' verdict at half that again;
no step at all, an inconclusive one."""

MIN_TRACE_STEPS = 1
"""A record built from a torch.profiler trace (``gpuscope analyze``) needs one recorded step: its verdict rests on
the kernel timeline and the host's ops over the whole recorded window (thousands of events, the way Holistic Trace
Analysis reads a trace of a few steps), not on a distribution of step times, and such traces hold 1-5 steps."""

# -- every recommendation -----------------------------------------------------------------------------------
MIN_RECOMMENDED_GAIN = 0.005
"""A rule whose measured gain is under half a percent of the step is not recommended: it would show as "~0% of step
time", below what a rerun can tell from noise (the rule's check records that it fired too small, and why)."""

# -- data loading ------------------------------------------------------------------------------------------
DATA_WAIT_NOTABLE = 0.05
"""TensorFlow's profiler calls a run moderately input-bound from 5% of step time spent waiting for input."""

DATA_WAIT_BOUND = 0.20
"""...and highly input-bound from 20%: from here on the loader, not the model, sets the pace."""

LOADER_KEEPS_UP_MARGIN = 0.1
"""A worker count hides loading when the loader probe measured it delivering batches at least 10% faster than the
training step consumes them: the probe times the loader alone, and in training the workers share the machine with
the step (and the rate varies from batch to batch), so a bare 1.0x would leave the step waiting part of the time."""

WORKERS_MOSTLY_WAITING = 0.5
"""DataLoader workers as many as the cores, still waited for, that were on a CPU or runnable and waiting for one
less than half the time they ran (the kernel's schedstat over the time they were watched) spend most of it blocked:
on files, the network, a remote store. More workers than cores then overlap those waits instead of queueing for a
core; the cores fill only when workers x their CPU share reach them. At half, a worker already needs a core for as
long as it is blocked, and the gain of going past the cores is at most twofold before they are full. Time waiting
for a core counts as busy: CPU-bound workers on crowded cores are on a CPU a fraction of the time, but never
blocked."""

WORKERS_WATCHED_MIN_S = 1.0
"""Seconds of worker time the host memory sampler must have watched (two scans at least, summed over the workers)
before their CPU share is taken as theirs: a first scan can fall in a spawned worker's import of torch."""

FILE_SYSTEM_SHORTER = 0.1
"""The file_system sharing strategy is advised where the step the loader probe predicts with it is at least 10%
shorter than both the median step and the step of the best plan without it: handing 4 built batches of 4 tensors
over took 30-34 ms with file descriptors and 4 ms with file_system (a collate function of 8 ms of Python in the worker),
while batches of tensors a worker builds without holding its GIL (NumPy, sleeps) hand over in about a millisecond
either way."""

# -- launch-bound vs compute-bound ---------------------------------------------------------------------------
LAUNCH_BOUND_OVERHEAD = 0.5
"""On a CPU run, when the ops issued per step times this machine's fixed cost per op (measured on tiny tensors)
explain at least half of the step, per-op overhead bounds it: fewer, larger ops (fusion, graphs, bigger batches)
pay more than faster arithmetic. Half is where the two costs are equal."""

COMPUTE_BOUND_MAX_OVERHEAD = 0.25
"""...and when they explain at most a quarter, the arithmetic bounds it. Between the two the run is mixed and the
verdict says inconclusive, with both figures."""

TINY_OP_RATIO = 4.0
"""...unless the ops themselves are tiny: when the mean op's own (self) time is at most 4x the measured fixed cost of
an op, the ops do next to no arithmetic each, and a step with at least COMPUTE_BOUND_MAX_OVERHEAD of fixed cost is
made of such ops: CPU-launch-bound, with less confidence. The share alone swings from 40% to 73% between repeated
runs of the same tiny-op workload on a shared 2-core VM (the step time doubles from one process to the next while the
calibration does not); the ratio stays between 1.3x and 2x there, against 300x and more for the compute-bound
samples, so it is the steadier of the two signals."""

GPU_BUSY_COMPUTE = 0.7
"""A GPU running kernels 70% or more of the step is busy: what is left to win is in the kernels themselves.
(The PyTorch TensorBoard plugin and Holistic Trace Analysis both treat low GPU utilisation as the first thing to
fix; NVIDIA's guides aim at keeping the GPU busy above roughly 70-80%.)"""

GPU_BUSY_STARVED = 0.5
"""A GPU idle half the step or more is starved; if the host was late for most of that idle time (host wait), the
host cannot launch work fast enough: CPU-launch-bound."""

HOST_WAIT_DOMINANT = 0.5
"""Host wait must make up at least half of the GPU's idle time to blame the launch rate."""

WINDOW_BUSY_APART = 0.1
"""Where the profiled steps' own busy share differs from the steady step's by this much or more, both are said."""

HOST_CLOSE_BEHIND = 0.7
"""A compute-bound step the host takes this share of to queue is close to launch-bound: cutting its GPU time by
more than the rest makes it wait on launching, which is said."""

SIDE_NOTABLE = 0.1
"""A GPU step that is neither busy nor starved gets the verdict of the side whose headroom (the step it would save
were it free: the kernels, or the host's launches) is larger, where that is at least a tenth of the step; else the
idle time is something else (syncs, copies) and the verdict is inconclusive."""

MIXED_CONFIDENCE = 0.5
"""The confidence of a verdict whose GPU step is partly busy and partly waiting on launches (busy between
``GPU_BUSY_STARVED`` and ``GPU_BUSY_COMPUTE``): the larger side is the verdict, the other named with its share."""

MARKER_COST_S, ALLOCATOR_READ_COST_S, NVTX_RANGE_COST_S = 5.7e-6, 27e-6, 0.5e-6
"""Host time of gpuscope's own CUDA calls, each, on an H100 (``benchmarks/cuda_calls.py``, 2026-11-24): a timing
marker's record, capture check and query (its elapsed time, not timed there, left out); one reading of the
allocator's counters; an NVTX range's start and end. What a run's counts of them cost a step is said beside its
step figures."""


HOST_AHEAD = 0.8
"""A steady step the host finished in at most this share of its time on the GPU was queued ahead: the host was not
held back (by a full launch queue or a sync) in it, so its host time is how fast the host queues a step. A step
the host keeps pace with differs from its device time by the clocks' jitter only (5% in the launch-bound H200
recording)."""

KERNELS_FIT = 1.15
"""The profiled steps' kernel time a step describes a steady step where it is at most this multiple of the steady
step on the device's clock (the two medians of the same loop differ by a few percent); more, and the profiled steps
ran other work (a phase of the run), so their own busy share is used."""

PROFILED_OP_COST_S = 3e-6
"""In a trace where every step is profiled (``gpuscope analyze``), the host time torch.profiler adds for each torch op
it records (the op's event and its launches' runtime events): the H200 recordings' profiled steps against the same
loops under plain python took 4.2 us more an op (``resnet-b96``: 15.2 ms a step with 1,059 ops, 10.8 ms plain) and
6.4 us (``overhead-loop``); 3 us is under both, so that a launch wait the profiler makes is taken off, not more."""

HOST_BOUNDS_WAIT = 0.1
"""Where the host never ran ahead of the GPU, it is taken to bound the step (its step is its pace) if the GPU waited
for it at least a tenth of the step; with less, it kept pace because it waited on the GPU (a full launch queue, a
sync), and how fast it would go is not known."""

HOST_AHEAD_MIN_STEPS = 3
"""Steps queued ahead needed for their median to say how fast the host goes (a profiler's window ends with a sync,
after which the host runs ahead for a few steps until the launch queue fills)."""

# -- steady steps at two speeds; the profiled window ----------------------------------------------------
TWO_SPEED_SEPARATION = 0.8
"""The steady steps run at two speeds where the split of their log times into a fast and a slow group that sets the
groups most apart (Otsu's threshold) explains at least 80% of the log times' variance: times spread evenly give 0.75,
two separate speeds 0.83 to 0.98 here (an IterableDataset with spawn workers 0.83-0.91, an accelerate loop 0.96, a
Transformers loop with a slow middle phase 0.98)..."""

TWO_SPEED_GAP = 3.0
"""...the two groups' median times are 3x apart or more (the IterableDataset's 8 and 95 ms steps, median 27 ms;
the accelerate loop's 24 and 616 ms, median 275 ms)..."""

TWO_SPEED_MIN_SHARE = 0.15
"""...and each group is at least 15% of the steady steps: fewer slow steps are a tail (the Transformers loop's 37
slow steps of 190 are 19%). Over 118 run records kept here this names 10 (those above, and data-bound runs whose two
workers deliver in rounds); it leaves out 5 whose groups are 3.5-27x apart with a continuum of times between them."""

WINDOW_UNLIKE = 4.0
"""The op profile (torch.profiler's few steps) describes the steady state unless its steps' median wall time is 4x
the steady median or more (or a quarter or less). Over 77 run records kept here (samples, held-out and user-style
scripts, CPU and replayed GPU traces) the ratio stayed between 0.3 and 2.6 (the profiler's own cost lengthens op-heavy
steps by up to 1.5x; a data-bound loader's waits vary); a script whose first phase trained another model put the
window in steps 17x and 50x the steady ones (two runs)."""

COUNTED_STEP_UNLIKE = 2.0
"""A step's FLOP count describes the steady steps unless the steady steps around it run at twice the steady median
or more (or half or less): their work is then another size than the median step's, and FLOPs over the median step
would be off by as much (pytorch/examples' REINFORCE counted an early, short episode's 115 kFLOP at step 10 against a
median episode several times longer). Tighter than ``WINDOW_UNLIKE``: the steps judged are unprofiled."""

# -- a CPU step spent outside torch's ops ---------------------------------------------------------------
OPS_COVER_STEP = 0.3
"""A CPU step whose torch ops (their self time in the profiled steps) take less than 30% of it is not bound by their
arithmetic however little of it is per-op overhead: it is spent outside torch (a sleep, a wait on another thread, the
user's own Python). On the compute-bound runs measured here the ops covered 60% to over 100% of the median step (the
profiler's own cost inflates them); on a loop sleeping 500 ms a step, 1 to 4%; on a loop waiting on a prefetching
thread's queue, 1%."""

OUTSIDE_MODEL_DOMINANT = 0.5
"""...nor one where half of each step or more is "other" (the script's code between the model's forward and backward,
the optimizer and loader waits: a generator building batches, logging, an environment) with ops under 60% of it: numpy
crops in a generator had "other" 70%, ops 33%, and read CPU-compute-bound at 0.92. Compute-bound runs here had "other"
at most 7%, launch-bound tiny models 6-27%; a distillation loop's frozen teacher (no_grad) "other" 79%, ops 81%."""

OTHER_NAMED = 0.15
"""Where the step's "other" phase (the script's code between forward, backward, the optimizer and the loader waits)
takes this share or more, the verdict names the script's functions that ran there, by the Python profile: an EMA of
the weights updated after each step (timm's ModelEmaV2 on a 12-block MLP) was 20% of the step; launch-bound tiny
models had "other" at 6-27%, mostly the loop's own lines, which no function holds."""
BETWEEN_PHASES_NAMED = 0.02
"""...each function named from this share of the Python profile's steps up: below it, a line that would not say
where the time is."""

AUTOCAST_KIND_NOTABLE = 0.05
"""``cpu-mixed-precision`` counts a kind of op (convolutions, matmuls) from a twentieth of the step's op time: a
conv net's linear head (0.4% of it) would save a fraction of a millisecond, and its line would only crowd the
evidence."""
CPU_MIXED_PRECISION_NOTABLE = 0.1
"""bfloat16 autocast on a CPU is advised from a tenth of the step saved: autocast casts each weight and some
activations at every step, which the timed shapes hold but a gain smaller than this would not rise above the noise
between two runs here (4.5% a run)."""

FROZEN_MODEL_NOTABLE = 0.1
"""A model no optimizer trains (a frozen teacher, an encoder) is named in the verdict's evidence where its forward
takes a tenth of the step or more: the distillation loop's teacher took 63% of it (22.2 ms a call, a 32.6 ms step)."""

FROZEN_IN_OTHER_SLACK = 0.02
"""A frozen model's forward is told as part of the step's "other" phase where its share is at most that phase's and
this much: the two are medians over the same steps, taken apart (fast_neural_style's frozen VGG16: 34% of the step,
"other" 36%)."""

RECOMPUTE_NOTABLE = 0.1
"""Activation checkpointing's recomputation is worth turning off from a tenth of the step: a tiny GPT-2 under HF's
Trainer with ``gradient_checkpointing=True`` spent 33% of its 144 ms step running its 4 blocks' forwards again, and
ran 36% faster without it (docs/diagnosis.md)."""
SAVES_NOTABLE = 0.05
"""Checkpoint saves made while the loop trains are worth making less often from a twentieth of the training steps'
time: a 60 MB MLP and its Adam state saved every 25 steps of 44 ms took 65 ms a save, 5.5% of the steps' time, all of
it in steps the median leaves out; saving half as often gives back half of it."""
LOADER_OPS_NOTABLE = 0.1
"""The CPU verdict says how many of a step's torch ops built its batches in the DataLoader's ``__next__`` (a loader
without workers: each item's conversions, the collate), and holds the other ops against the step less its data wait,
from a tenth of the ops: a VAE's MNIST-style items made 1,547 of its 2,166 ops a step, and the verdict read their fixed
cost, paid per item, as launch overhead ("CPU-launch-bound, 36% of the step"). Those ops are left out of the fixed
cost whatever their share."""
SPARSE_FLOPS_NOTABLE = 0.05
"""A compute-bound step gets no what-if at the peak where a twentieth or more of its counted FLOPs are sparse matmuls'
(counted by the elements they store): their op-table rows are the dense ones' (``aten::addmm``), and their gathers
run far below any dense peak. A graph network's sparse feature and adjacency matmuls, 72% of its counted FLOPs, read
"3.05x faster at the peak" for what no dense kernel would do."""
NO_GRAD_NOTABLE = 0.1
"""Forward passes without gradients in every step (an evaluation after each update) are worth running less often
from a tenth of the steps' time: pytorch/examples' GCN evaluates on its train and validation nodes after every
update, two passes of 2.5 ms each in its 12 ms step (40%), its printout every 20 epochs the only reader."""
EVALUATE_EVERY = 10
"""The steps between evaluations ``evaluate-less-often`` suggests, where the loop evaluates at every one: the gain it
promises is the passes' share less a tenth of it."""
DROPOUT_NOTABLE = 0.1
"""Dropout is worth turning off, where the model does not need it, from a tenth of the step: a TransformerEncoder
text classifier's (p = 0.1) on the 2-core CPU took 34-38% of its 102-122 ms step, most of it drawing the masks
(``aten::bernoulli_``, about 6 ns an element: a mask of 786k elements 4.6 ms, the matmul beside it 3.2 ms), and
its step ran 32-49% faster with dropout at 0; a tiny GPT-2's, 24% (32-43% faster without). On a GPU the masks are
drawn in the fused kernel and cost little."""
CHECKPOINT_HEADROOM_SHARE = 0.5
"""Turning checkpointing off is advised where the activations it would keep, at most, fit in half the memory the
run left free: each checkpointed call's recomputed activations were all live at once in backward, so they are at
most the peak less the parameters and the optimizer's state, and the calls keep at most that many times it."""

OPS_COVER_OUTSIDE_MODEL = 0.6
"""...the share of such a step its torch ops must cover for the step to count as computing (above)."""

OPS_COVER_CALLER = 0.9
"""...and then the functions named as holding that time are those whose cumulative time is at least 90% of the
heaviest function's own time (its callers)..."""

OPS_COVER_CALLERS = 4
"""...at most four of them."""

# -- data-parallel jobs ---------------------------------------------------------------------------------------
COMM_BOUND = 0.5
"""A rank whose training thread waits on collectives (gradient all-reduce) for half its step or more is bound by
communication: more bandwidth, or less to send per sample, pays more than faster arithmetic. Half is where the
two are equal, as for LAUNCH_BOUND_OVERHEAD."""

COMM_NOTABLE = 0.2
"""Waiting on collectives for a fifth of the step is worth cutting (the 20% at which TensorFlow's profiler calls
input highly bound, applied to the other thing a data-parallel step waits on)."""

FORWARD_COMM_NOTABLE = 0.05
"""The share of the collectives' wait in those issued in forward from which ``reduce-communication`` says it left
them out of its gain (under it, the gain is the same to within its rounding)."""

ACCUMULATION_STEPS = 4
"""Micro-batches per all-reduce in the suggested gradient accumulation: communication falls to a quarter per
sample; the expected gain is that share of the exposed wait."""

STRAGGLER_SHARE = 0.25
"""A rank whose own work per step exceeds the other ranks' median by a quarter of the step holds them all back:
under that, rank-to-rank jitter explains it (two balanced ranks sharing a 2-core machine differed by 12%; an
injected 64 ms loading delay showed as 79%). It must also exceed how far the other ranks' own steps stray from
their median, half their 10th-90th percentile range: a loaded 2-rank job once had a rank 38% "late" with steps
varying more than that. Half, not the whole range: a rank slowed by 64 ms a step on a loaded machine was 80 ms late
while the other rank's steps spanned 90 ms, 10th to 90th percentile."""

STRAGGLER_EXPLAINED = 0.5
"""A straggler's own step phases must hold at least half of its lateness as extra time over the other ranks' (a
rank slowed by a loading delay: 89% of it in data wait). Lateness no phase holds comes from the ranks' collective
waits differing, not their work: balanced ranks on a loaded 2-core machine showed 15.7 ms of it with 4% in any
phase, and 15.1 ms with 9% (benchmarks/straggler_noise.py)."""

STRAGGLER_ARRIVAL_SHARE = 0.12
"""Where every rank's collectives were matched (``diagnose.arrival``), a rank whose own work (its step less its idle
time inside collectives and its wait for a CPU) exceeds the other ranks' by an eighth of the profiled step holds
them back: a rank doing 12 ms more arithmetic a step in a 60-100 ms DDP step was 13-20% over quiet, 9-25% beside 2
busy processes on the 2-core machine (the other rank's core now and then slower too). Balanced ranks differed by up
to 21% there (a rank sharing its core with a busy process runs every phase slower), 1-4% quiet; the checks below
tell most of them apart (``STRAGGLER_BEYOND_PACE``, ``STRAGGLER_STEADY_SHARE``, arriving last every step). A tenth
was tried with them: on the 93 jobs it was chosen on, 55 of 59 stragglers named against 53 and no more balanced
jobs; on 8 fresh balanced jobs beside busy processes it named one more (11.7% late in backward), and a
communication-heavy job one more (11.8%): left at an eighth (benchmarks/straggler_noise.py)."""

STRAGGLER_LAST_STEPS = 2 / 3
"""...and does more work than the others in at least two thirds of the profiled steps: step after step, not once
by bad luck."""

STRAGGLER_CAUSE_SHARE = 0.5
"""...and at least half its extra work (summed over the phases where it does more) lies in the phase named: a rank
with work of its own to do has it in one place, one slowed by its core is slower all over. Of 70 ranks slowed by
12 ms a step in one phase and named, the least held 50.5% of their excess there; CI's timed part, run alone, named a
balanced job's rank 0 late in backward (6.5 ms, 13% of the step, late in all 3 steps) with 43% of it there
(benchmarks/straggler_noise.py --merge-again). Not asked where the phase stands out against the rank's own pace
(``_concentrated``): there its whole step's excess is hidden by a faster core in the rest."""

STRAGGLER_BEYOND_PACE = 0.06
"""...and, in such a phase, its profiled work there exceeds what its pace in its other phases predicts (the other
ranks' work in that phase times the ratio of its work to theirs in the rest) by this share of the profiled step: a
rank on a slower or shared core is slower in every phase alike, for the whole run, and the steady steps say the same.
On the 2-core machine beside 2 busy processes, 38 ranks slowed by 12 ms of work a step in data, forward or the
optimizer were 9.3-36.4% of the step beyond their pace; a balanced job's rank named 14.7 ms late in forward, 1.31x
slower in its other phases, 3.7% (benchmarks/straggler_noise.py). Not used for backward, where the gradient
all-reduces' threads take the ranks' cores unevenly (stragglers there ranged from -4% to 16%)."""

STRAGGLER_EVERY_STEP = 0.08
"""...and where the steady steps cannot bear it out (DDP's backward, whose wait the others' steady backward holds),
its whole step's excess is at least this share of the step in every profiled step, two thirds of
``STRAGGLER_ARRIVAL_SHARE``: extra work is there every step, a slow core's lateness comes and goes. On the 2-core
machine 13 ranks slowed by 12 ms in backward were 9.5-20% over in their least step; balanced jobs named late in
backward 2.8% (run alone in CI: 2.8, 14.4, 23.7%), 6.6% and 11.2% (benchmarks/straggler_noise.py)."""

STRAGGLER_STEADY_SHARE = 0.06
"""...and, where the other ranks do not wait in the phase that holds its extra work, the run's steady steps show that
phase longer on it too, by half ``STRAGGLER_ARRIVAL_SHARE``: three profiled steps of bad luck are not the run. On the
2-core machine beside 2 busy processes, ranks slowed by 12 ms of arithmetic a step in data, forward or the optimizer
showed 6.9-28.1 ms more in that phase over their steady steps (8-30% of the step, 19 jobs); a balanced job whose
profiled steps named a rank 11.7 ms late in forward showed 0.8 ms (1%) (benchmarks/straggler_noise.py). Where the
others' steady phase holds their wait for it (DDP's backward) the straggler must instead arrive last in every
profiled step: 5 ranks slowed in backward did in 3 of 3; a balanced job named late in backward under CI's load
(8.0 ms, 13% of the step) arrived last in 2 of 3. (On a CPU it must also call ops the others do not, or be late in
forward too: ``STRAGGLER_EXTRA_OPS``.)"""

STRAGGLER_MORE_CALLS = 0.05
"""The ranks' traced ops set side by side (``OpProfile.host_ops``): a rank calls an op more often than the others
where its calls a step exceed theirs (their median) by this share and by half a call at least. Ranks of one
data-parallel job call every op of the model and of DDP's reducer as often as each other: on the 2-core machine, of
208 kept and fresh 2-rank jobs, the 114 with no extra arithmetic (balanced, communication-heavy, a rank slowed by
its loader) differed in no op; each of the 94 ranks given 12 ms of arithmetic a step made 340-580 calls a step more
than the other (``tanh``, ``mm``, ``matmul``), 7.7-31% of the step (benchmarks/straggler_noise.py)."""

STRAGGLER_EXTRA_OPS = 0.06
"""The time of the calls a rank makes more often than the others (``STRAGGLER_MORE_CALLS``; the op's self time over
theirs, theirs taken at the rank's pace where it runs the shared calls faster, at most the extra calls' share of
it) below which a rank late in backward on a CPU, and late in forward by less than this share too, is slower, not
busier: it runs the same ops as often, each slower in backward alone (its core shared with the gradient
all-reduces' threads), where larger inputs (uneven sequence lengths) would lengthen its forward as well. Half
``STRAGGLER_ARRIVAL_SHARE``. On the 2-core machine, 28 ranks slowed by 12 ms of arithmetic in backward ran 9-31%
of the step in extra calls; CI's balanced job named late in backward (14% of the step, its forward 0.1 ms shorter)
made none. A rank of a Lightning job given sequences 1.5x as long called no op more often, its forward 8.0 ms (12%) and
its backward 9.6 ms longer; the kept balanced job named 24.1 ms late in backward, on a core slower in everything,
is as long in forward (11.2 ms, 10%) and is still named (benchmarks/straggler_noise.py). On a GPU a slower device is
a straggler of its own, and this is not asked."""

STRAGGLER_BY_OPS = 0.08
"""A rank whose extra calls (``STRAGGLER_EXTRA_OPS``) take this share of the profiled step, and that arrives last at
the collectives or does more work than the others (its step less its waits) in ``STRAGGLER_LAST_STEPS`` of them, is
a straggler by its ops, however large those figures read: the ops ran, the others waited. The calls are counted, not
a difference of noisy times, so the bar is what is worth a finding: ``STRAGGLER_EVERY_STEP``'s. On the 2-core machine
beside 2 busy processes, ranks given 12 ms of arithmetic a step ran 7.7-31% of the step in extra calls; balanced and
communication-heavy jobs none (``STRAGGLER_MORE_CALLS``). At an eighth, first tried, it named 6 of the 9 kept
stragglers the step's figures had missed, and a fresh set then missed two at 9.2% and 11.8%; at 8%, a second fresh
set named 24 of 25 stragglers and no balanced job (benchmarks/straggler_noise.py)."""

# -- launches, fusion, copies and mixed precision ------------------------------------------------------------
LAUNCH_NOTABLE = 0.3
"""Per-op overhead (or host-wait idle on a GPU) from which launch-cutting advice is worth giving (below a third of
the step the arithmetic or the loader matters more)."""

ELEMENTWISE_NOTABLE = 0.3
"""Fusion is worth suggesting when at least this share of the op calls are element-wise chains' material."""
PINNED_COPY_SAVING = 0.5
"""Pinned host memory copies at about twice the speed of pageable memory (NVIDIA's bandwidth test figures): about
half the pageable copy time is saved."""

TENSOR_CORE_ENOUGH = 0.5
"""With half or more of the kernel time already on Tensor Cores, mixed precision is (mostly) in use."""

SIXTEEN_BIT_BYTES = 0.5
"""Under autocast the activations between layers are 16-bit, half the bytes of float32: the kernels that stream
them (element-wise, normalisation, pooling, layout conversions, attention) take about half their time. The
optimizer's kernels stay in float32 (the master weights), as do communication kernels. On the H200 recordings this
puts mixed precision within 10% of what it measured: a float32 ResNet-18 at batch 256, 55% of its step saved with
channels_last (estimated 55%); a GPT, 68% (73%); a wide MLP, 89% (90%)."""

# -- preprocessing -----------------------------------------------------------------------------------------
FLOAT16_SHARE_NOTABLE = 0.3
"""float16 work is worth moving to float32 from this share of an item's build time on (the data probe's lines
that produced float16 data). A float32 pipeline that casts to float16 at its very end has only that cast on
float16 lines: measured at up to a fifth of the item's time when the float32 math is light (a 96x96 image), so
from 30% on the float16 time is arithmetic, not the final cast."""

CHEAPER_LINE_SHARE, CHEAPER_LINE_MIN_S = 0.2, 20e-6
"""``cheaper-batches`` names the dataset's lines taking at least this share of fetching an item (the data probe's
own time per line) and this long, at most ``CHEAPER_LINES_SHOWN`` of them, and fires where together they take
``CHEAPER_LINES_SHARE``: a line that heavy is one piece of work (a per-row Python loop, a decode, a transform), not
the item's indexing (a GIN script's items built ahead of training: `x, edges, label = self.graphs[i]`, 8.8 us of
11.7). On a tabular dataset transforming each row of a batch in a Python loop, the loop was 98% of the time on the
dataset's lines (19.4 of 19.8 ms a batch)."""
CHEAPER_LINES_SHARE, CHEAPER_LINES_SHOWN = 0.3, 3
"""...the share of fetching an item the named lines must take together, and how many are named at most."""
CHEAPER_ITEMS_SHARE = 0.5
"""...where fetching a batch's items, untraced, is half its build at least (else the collate_fn's: 27% a padder's)."""
WORKERS_HELP = 0.05
"""Workers help the loading where a worker count is predicted to shorten the step by this share at least (the
share from which data wait is notable): below it, on this machine, only less work per batch cuts the wait."""
CHEAPER_ONE_CALL_SAVES = 0.5
"""``cheaper-batches`` advises building each batch in one go (its items light: no line of the dataset's to name)
where the data probe got the batch, sliced from its tensors or fetched through the loader in one call, in at most
half the time of building it item by item and collating it: the per-item calls and the stacking of many small
tensors are then most of the build, not the items' data (a 2,048-row TensorDataset, batches of 512: 1.0 ms item by
item, 0.12 ms in one call, 0.013 ms sliced)."""
CHEAPER_ONE_CALL_ITEM_S = 10e-6
"""...slicing advised only for items built in this long or less each (collation included; a TensorDataset's items
always, being their indexing by construction): such an item is its indexing and the call (2 us a TensorDataset's,
0.3 us a list's), with no work in it (a decode, a transform, a random augmentation) that slicing stacked tensors
would drop."""

FLOAT16_SLOWDOWN_NOTABLE = 1.5
"""NumPy float16 arithmetic must run at least this many times slower than float32 on the machine (timed by the
data probe) for float32 to be worth it. Without native float16 arithmetic NumPy converts each element to float32
and back around every operation (19x slower measured on an AMD EPYC with F16C but no AVX512-FP16). CPUs with
native float16 arithmetic (AVX512-FP16, ARMv8.2 FP16) should come out near 1x, where float32 only doubles the
bytes moved; 1.5x leaves room for timing noise between the two."""

# -- CUDA settings (rules/cuda_settings.py) -----------------------------------------------------------------
SYNCS_PER_STEP_NOTABLE = 1.0
"""A training step needs no host-device synchronisation at all: the host can queue step after step. From one per
step (a logged ``loss.item()``) the host waits for the GPU to drain its queue every step, and the GPU then waits
for the host to queue the next work (PyTorch's performance tuning guide: avoid unnecessary CPU-GPU syncs)."""

TF32_MIN_CAPABILITY = (8, 0)
"""TF32 Tensor Cores came with Ampere (compute capability 8.0, A100); earlier GPUs run float32 GEMMs on CUDA
cores whatever the setting."""

TF32_DEFAULT_OFF_SINCE = (1, 12)
"""torch 1.12 turned TF32 off for matmuls by default (``torch.backends.cuda.matmul.allow_tf32 = False``, and
``torch.set_float32_matmul_precision`` added with default "highest"); torch 1.7-1.11 used TF32 by default."""

FP32_GEMM_NOTABLE = 0.1
"""TF32 is worth suggesting when float32 CUDA-core GEMMs take at least a tenth of kernel time: even at a quarter
of the datasheet's TF32 speed-up that is 5% of the GPU's busy time."""

CONV_SHARE_NOTABLE = 0.2
"""Convolution-specific advice is worth giving from a fifth of kernel time in convolutions: below that, even the
seeds' autotuning gain (7% of convolution time on a V100) is worth under 1.5% of the step."""

CONV_STEP_NOTABLE = 0.1
"""...and from a tenth of the steady step: a data-bound conv net's GPU, idle 99% of the step, gets no autotuning
advice however its kernel time divides (at the seeds' 7% of convolution time, that is under 1% of the step)."""

REDUCED_PRECISION_TC_SHARE = 0.2
"""With at least a fifth of kernel time on Tensor Cores the convolutions run in reduced precision (autocast), where
cuDNN's Tensor Core kernels want NHWC data."""

CHANNELS_LAST_FEW = 0.5
"""A net with fewer than half of its convolution weights in channels_last is an NCHW net."""

LAYOUT_TRANSFORM_NOTABLE = 0.05
"""cuDNN converting NCHW <-> NHWC for 5% of kernel time or more is worth removing: channels_last makes those
kernels disappear outright. (PyTorch's channels_last tutorial measured AMP training 22% faster on ResNet-50 and
8-35% across the models it tried on a V100; only the conversions' own time is counted here.)"""

# -- habits (diagnose/rules/habits.py) ----------------------------------------------------------------------
BIAS_BEFORE_NORM_MIN_LAYERS = 1
"""One biased layer feeding BatchNorm is enough to say so: its bias is wasted work wherever it is, and the fix is a
keyword argument."""

# -- the optimizer's update (diagnose/rules/optimizer.py) -------------------------------------------------------
OPTIMIZER_SHARE_NOTABLE = 0.05
"""The optimizer's update is worth a recommendation from 5% of the step, the bar a data wait must reach to be
notable (``DATA_WAIT_NOTABLE``)."""
FUSED_SPEEDUP_NOTABLE = 1.2
"""A fused update is recommended where the probe timed it at least this many times faster than the run's: under
that, two timings of a few bursts after the run cannot tell it from noise."""

OPTIMIZER_UPDATE_WHOLE = 0.9
"""Where the probed optimizer class's own steps took this share of the run's optimizer steps or more, the phase is
taken for its update; under it (a wrapper's step around them, ZeroRedundancyOptimizer's broadcast), the fused gain
counts that share only."""

# -- speed of light and number formats on a CPU (diagnose/speed.py, diagnose/rules/precision.py) ------------------
TIMED_FLOPS_SHARE = 0.9
"""A compute-bound CPU step's what-if puts only its matmuls and attention at the peak, its other ops and Python kept
as they are, where those ops hold this share of its counted FLOPs or more (their time is their op table rows'); the
rest of the counted FLOPs (a ViT's patch convolution: 0.2%) stay in the kept time. With less, the whole step at the
peak, as before: a convolution's time is spread over the ops it calls."""
MEASURED_PEAK_NOISE = 1.5
"""A CPU run's own FLOP/s above the matmul rate measured after it, by at most this factor, is the benchmark slowed
by a shared machine's load, and the peak is raised to the run's rate; beyond it the benchmark does not describe the
run's matmuls (their dtype or shapes run at another rate): no MFU is given. Seen: in CI the benchmark measured 87
GFLOP/s after a run whose steps did 92 (1.06x). On the project's 2-core machine a second busy process slowed the
best-of-5 1024x1024 float32 benchmark from 91 to 30-45 GFLOP/s on 1 thread (2-3x), but a step's FLOP/s is below
its matmuls' rate (it runs other ops too) and the run before the benchmark shares most of the machine's load: only
load the two do not share puts the benchmark under the run. The bfloat16 run that showed the bug did 4.0 GFLOP/s
against 0.95 measured (4.2x), on a CPU without bfloat16 matrix instructions. 1.5x covers the noise seen with room,
and leaves "100% of peak" unsaid where the benchmark times another kind of matmul than the run's."""

ROLLOUT_FORWARDS, ACCUMULATED_MFU = 4, 0.02
"""``larger-batch`` advises stacking samples into one forward, rather than larger batches, where the trained model
runs forward this many times or more for each ``backward()`` and no DataLoader batched its inputs: a policy's
rollout (pytorch/examples' REINFORCE: 60), a decoder called token by token (the seq2seq tutorial: 12). A loop of one
forward and one backward a batch gives 1 (the Trainer, accelerate and Lightning loops, LBFGS's closure), a DCGAN's two
models 1.33. On the REINFORCE loop (2-core machine) two episodes an update instead of one took the same time per
environment step (0.70 and 0.73 ms against 0.78 and 0.63), where the batch advice had promised 16% of the step. And
it advises one pass over a step's batches, where gradients accumulate over 2 or more and the step's arithmetic ran
at ACCUMULATED_MFU of the peak or less, its ops tiny: each pass is then fixed cost (a text classifier accumulating
8 batches of 8: 0.1% of the peak; one batch of 64 took 69% off the step)."""

CPU_FLOAT64_SLOWER = 1.5
"""``float32-over-float64`` fires where this machine's float32 matmul rate is at least 1.5x its float64 rate, both
measured after the run back to back (below that, load could make the difference: MEASURED_PEAK_NOISE). A CPU's
vector units hold twice as many float32 lanes as float64 ones: on the project's 2-core AMD EPYC, 1024x1024 matmuls,
float32 80 and float64 36 GFLOP/s on 1 thread (2.2x), 124 and 62 on 2; after a float64 fit, 169 and 70 (2.4x)."""

CPU_LOW_PRECISION_SLOWER = 1.5
"""``cpu-fp32-over-low-precision`` fires where this machine's float32 matmul rate is at least 1.5x its rate in the
run's bfloat16 / float16: the two are timed back to back, so a smaller ratio could be load (MEASURED_PEAK_NOISE);
beyond it the rule's gain, worked out from the measured rates, decides. On the project's 2-core AMD EPYC (no
AVX512-BF16 / AMX), 1 thread, 512x512: float32 93 GFLOP/s, bfloat16 and float16 1.3 (73x); CPUs with bfloat16
matrix instructions run bfloat16 faster than float32, and the rule stays clear."""

# -- trials (gpuscope run --try; diagnose/trials.py) -----------------------------------------------------------
TRIAL_MAX_S = 30.0
"""A trial runs the script for as many steps as the untouched run had, up to the steps that take this long at its
median step: a step of milliseconds is measured over thousands of steps, so that a hiccup of the machine (another
process's burst, a page-cache flush) moves the median little. Measured on a 2-core machine, 50 steps of 2.3 ms (0.1 s
of steps) gave speed-ups of 0.78x and 1.04x in two trials of the same fix."""

TRIAL_STEADY_STEPS = 20
"""...but at least this many steps past the untouched run's last profiled one (a trial has the same windows over the
same first steps), where it had them: slow steps vary less than fast ones, and 20 of each of two runs give a median
whose interval is a few percent wide."""

TRIAL_ROUNDS = 2
"""Runs of each fix (and of the untouched script: the user's run, then once more per round after the first), taken
in turn: one script's runs differ from process to process (on a 2-core machine, the same script's median step by
10-20% from one run to the next, where its steps varied 2% within a run), and a speed-up from one pair of runs is
off by that much."""

LOSS_DRIFT_FLOOR = 0.02
"""A trial's mean loss within 2% of the untouched run's, over the steps compared, is the same loss: a fix that
changes only how the arithmetic is done (fused kernels, TF32, bfloat16 autocast) moves it less; one that breaks
training (a NaN, a diverging run) moves it far more."""

LOSS_NATURAL = 2.0
"""...and a trial's loss counts as the same while it is within this many times the difference between two
untouched runs' losses (a script that seeds nothing differs from run to run)."""

LOSS_SPREADS = 4.0
"""...and where the untouched run's own step-to-step spread makes two of its runs differ more (an unseeded script:
another shuffle, other initial weights), the tolerance is this many standard errors of the difference of two such
means, so that noise alone is flagged about never."""

# -- memory ------------------------------------------------------------------------------------------------
LEAK_MIN_SHARE = 0.05
"""Memory that grows, after the warm-up and the profiling windows, by this share of what the process (or the CUDA
allocator) held at their start is a leak, where it grew in both halves of those steps (a plateau reached early,
the allocator's arenas filling, is not): benchmarks/memory_accuracy.py's two leaking loops grew 2.1-4.0 MB a step
over 45-65 steps under gpuscope (their processes held 0.3-0.4 GB), the loop without a leak -0.05 to 0.14 MB a
step."""
LEAK_MIN_BYTES = 16 << 20
"""...and by this many bytes at least: a few MB is the allocator's and Python's own drift."""
LEAK_HALF_SHARE = 0.25
"""...each half of the steps growing at this share of the whole's rate at least."""
LEAK_KEPT_AGREES = (0.25, 2.0)
"""A leak's rate is what the memory window saw a step keep where that is within these multiples of the growth's
rate: resident memory grows by what is kept and the allocator's slack (benchmarks/memory_accuracy.py: 2.1 MB kept a
step grew resident memory 2.1-4.2 MB a step under plain python, run by run), and one tensor kept a step beside a leak
of something else is not its rate."""
LEAK_MIN_STEPS = 20
"""Steps after the windows the readings must span for growth to be told."""
SHORT_OF_MEMORY = 0.10
"""A run whose peak leaves less than this share of its limit free (the device's memory, the host's, its cgroup's or
its address-space limit) is short of memory: the memory fixes become recommendations (``reduce-memory``);
elsewhere one line says how much room there is."""
HALF_PRECISION = 0.5
"""Mixed precision's 16-bit activations: half the float32 ones' bytes."""
SMALLER_STATE = 0.5
"""An optimizer whose state is half Adam's (SGD with momentum keeps one buffer a parameter; Adam, two)."""
