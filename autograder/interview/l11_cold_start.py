"""Lesson 11 questions: seconds per hop, serial vs pipelined loads, bytes per rank, restarts (the PCIe bound and
a copy from pageable pages), many replicas sharing one store, the design."""
from __future__ import annotations

from .question import Numeric, Open, fmt, template

STEM = "l11_cold_start"
PCIE_GEN5_X16 = 63.0  # GB/s per direction (reference-facts)


@template(STEM, "the network hop")
def network(rng, ref):
    gb = rng.choice([16.0, 70.0, 141.0, 280.0])
    gbit = rng.choice([25.0, 100.0, 200.0, 400.0])
    s = ref.hop_seconds(gb * 1e9, ref.Hop("net", gbit, "Gb/s"))
    q = Numeric(
        f"A checkpoint of {fmt(gb)} GB is downloaded from an object store over one {fmt(gbit)} Gb/s NIC, running at "
        "line rate. How many seconds does the download take?", "s", s,
        [f"{fmt(gbit)} Gb/s / 8 = {fmt(gbit / 8)} GB/s", f"{fmt(gb)} GB / {fmt(gbit / 8)} GB/s = {fmt(s)} s"],
        "NICs are rated in bits per second: divide by 8 before dividing bytes by it.", rtol=0.02,
        mistakes={"reads Gb/s as GB/s": gb / gbit, "multiplies by 8 instead of dividing": gb / (gbit * 8)})
    nics = rng.choice([2, 4])
    more = ref.hop_seconds(gb * 1e9, ref.Hop("net", gbit, "Gb/s", nics))
    q.follow_ups.append(Numeric(
        f"The node has {nics} such NICs and the download uses parallel ranged reads over all of them. Seconds now?", "s",
        more, [f"{fmt(gb)} / ({nics} x {fmt(gbit / 8)}) = {fmt(more)} s"],
        "Links in parallel add bandwidth, if the reads are parallel enough to fill them.", rtol=0.02))
    return q


@template(STEM, "PCIe to eight GPUs")
def pcie(rng, ref):
    gb = rng.choice([16.0, 70.0, 141.0, 280.0, 405.0])
    gpus = rng.choice([2, 4, 8])
    s = ref.hop_seconds(gb * 1e9, ref.Hop("pcie", PCIE_GEN5_X16, "GB/s", gpus))
    q = Numeric(
        f"{fmt(gb)} GB of weights sit in pinned host RAM and are split evenly over {gpus} GPUs, each on its own PCIe "
        f"Gen5 x16 link to the CPU (its own root port, no shared switch uplink; ~{fmt(PCIE_GEN5_X16)} GB/s per "
        "direction). At line rate, how long do the host-to-GPU copies take, all GPUs at once?",
        "s", s,
        [f"each GPU receives {fmt(gb / gpus)} GB over its own link", f"{fmt(gb / gpus)} / {fmt(PCIE_GEN5_X16)} = {fmt(s)} s"],
        "PCIe bandwidth is per GPU: eight links carry eight times what one does.", rtol=0.02,
        mistakes={"counts one PCIe link for the whole node": gb / PCIE_GEN5_X16})
    one = ref.hop_seconds(gb * 1e9, ref.Hop("pcie", PCIE_GEN5_X16, "GB/s", 1))
    q.follow_ups.append(Numeric(
        "A loader copies every rank's weights to GPU 0 first and scatters them from there. How long do the "
        "host-to-GPU copies take now (ignore the scatter)?", "s", one,
        [f"all {fmt(gb)} GB over one link: {fmt(gb)} / {fmt(PCIE_GEN5_X16)} = {fmt(one)} s"],
        f"Funnelling through one GPU throws away {gpus - 1} of the {gpus} links.", rtol=0.02))
    pairs = ref.hop_seconds(gb * 1e9, ref.Hop("pcie", PCIE_GEN5_X16, "GB/s", gpus // 2))
    q.follow_ups.append(Numeric(
        f"Back to every GPU receiving its own share, but now the {gpus} GPUs sit in pairs behind PCIe switches, each "
        "switch with one x16 uplink to the CPU. How long do the copies take?", "s", pairs,
        [f"{gpus // 2} uplinks carry the bytes, not {gpus} links: {fmt(gb)} / ({gpus // 2} x {fmt(PCIE_GEN5_X16)}) = "
         f"{fmt(pairs)} s"],
        "Count the narrowest shared links on the path: two GPUs behind one uplink share its bandwidth.", rtol=0.02,
        mistakes={"counts one link per GPU behind a shared uplink": s}))
    return q


def _chain(gbit: float, nvme_drives: int):
    return lambda ref: [ref.Hop("network", gbit, "Gb/s", 1), ref.Hop("NVMe", 7.0, "GB/s", nvme_drives),
                        ref.Hop("PCIe Gen5 x16", PCIE_GEN5_X16, "GB/s", 8)]


@template(STEM, "serial vs pipelined")
def pipelined(rng, ref):
    gbit = rng.choice([100.0, 200.0, 400.0])
    drives = rng.choice([2, 4, 8])
    chunk_mb = rng.choice([128, 256, 512])
    hops = _chain(gbit, drives)(ref)
    nb = 141e9
    serial = ref.cold_start_seconds(nb, hops, False, chunk_mb * 1e6)
    piped = ref.cold_start_seconds(nb, hops, True, chunk_mb * 1e6)
    each = [ref.hop_seconds(nb, h) for h in hops]
    q = Numeric(
        f"141 GB go from an object store over one {fmt(gbit)} Gb/s NIC, through a local NVMe cache ({drives} drives of "
        f"7 GB/s, an assumed figure, read in parallel) and over PCIe Gen5 x16 (~63 GB/s) to 8 GPUs. Streamed in "
        f"{chunk_mb} MB chunks with every hop busy at once, how many seconds does the load take?", "s", piped,
        ["whole-checkpoint time per hop: " + ", ".join(f"{h.name} {fmt(t)} s" for h, t in zip(hops, each)),
         f"slowest hop {fmt(max(each))} s + fill (one {chunk_mb} MB chunk through the other hops) = {fmt(piped)} s"],
        "Pipelined, the slowest hop sets the pace; the others cost only the time to fill the pipe.", rtol=0.02,
        mistakes={"adds the hops (serial)": serial, "reads Gb/s as GB/s": ref.cold_start_seconds(
            nb, [h._replace(unit="GB/s") if h.unit == "Gb/s" else h for h in hops], True, chunk_mb * 1e6)})
    q.follow_ups.append(Numeric(
        "And one hop after the other (download everything, then read it, then copy it)?", "s", serial,
        [" + ".join(fmt(t) for t in each) + f" = {fmt(serial)} s"],
        "Serial, every hop's full time adds up.", rtol=0.02))
    return q


@template(STEM, "bytes per rank")
def per_rank(rng, ref):
    import dataclasses

    from reference_engine.sim import gpu_model as gm

    shape = rng.choice([gm.LLAMA_3_8B, gm.LLAMA_3_70B])
    dtype, nbytes = rng.choice([("bf16", 2), ("fp8", 1)])
    shape = dataclasses.replace(shape, weight_bytes=nbytes)
    tp = rng.choice([2, 4, 8])
    b = gm.weight_bytes_per_rank(shape, tp) / 1e9
    full = gm.weight_bytes_per_rank(shape, 1) / 1e9
    q = Numeric(
        f"{shape.name} in {dtype} ({fmt(full)} GB) is served tensor-parallel over {tp} GPUs, everything split except the "
        "RMSNorm weights. How many GB does each rank read if it reads only its own slices?", "GB", b,
        [f"split part / {tp} + replicated norms ~ {fmt(full)} / {tp} = {fmt(b)} GB"],
        "Each rank reads its own byte ranges: the node moves the checkpoint once, not once per GPU.", rtol=0.02,
        mistakes={"has every rank read the whole checkpoint": full})
    net = ref.hop_seconds(tp * b * 1e9, ref.Hop("net", 100.0, "Gb/s"))
    q.follow_ups.append(Numeric(
        f"All {tp} ranks download their slices through the node's one 100 Gb/s NIC. Seconds for the download?", "s",
        net, [f"{tp} x {fmt(b)} GB = {fmt(tp * b)} GB at 12.5 GB/s = {fmt(net)} s"],
        "The NIC is shared: sharding saves the copies, not the node's download of the whole model.", rtol=0.02,
        mistakes={"gives each rank the whole NIC": b / 12.5}))
    return q


@template(STEM, "restart from the NVMe cache")
def restart(rng, ref):
    gb = rng.choice([16.0, 70.0, 141.0, 405.0])
    drives = rng.choice([2, 4, 8])
    hops = [ref.Hop("NVMe", 7.0, "GB/s", drives), ref.Hop("PCIe Gen5 x16", PCIE_GEN5_X16, "GB/s", 8)]
    s = ref.cold_start_seconds(gb * 1e9, hops, True, 256e6)
    q = Numeric(
        f"The replica restarts on the same node; {fmt(gb)} GB are on its local NVMe cache ({drives} drives of 7 GB/s "
        "sequential read, assumed, read in parallel), streamed in 256 MB chunks to 8 GPUs over PCIe Gen5 x16 "
        "(~63 GB/s each), reads and copies overlapped. Seconds for the weights?", "s", s,
        [f"NVMe: {fmt(gb)} / ({drives} x 7) = {fmt(ref.hop_seconds(gb * 1e9, hops[0]))} s (the slowest hop)",
         f"+ one chunk over PCIe x8 = {fmt(ref.hop_seconds(256e6, hops[1]))} s -> {fmt(s)} s"],
        "A local cache takes the network out of every restart; its drive count is its bandwidth.", rtol=0.02,
        mistakes={"adds the hops (serial)": ref.cold_start_seconds(gb * 1e9, hops, False, 256e6),
                  "ignores the parallel drives": ref.cold_start_seconds(
                      gb * 1e9, [hops[0]._replace(links=1), hops[1]], True, 256e6)})
    rate = rng.choice([8.0, 12.0, 20.0, 25.0])
    warm = ref.hop_seconds(gb * 1e9, ref.Hop("pageable copy", rate, "GB/s", 8))
    bound = ref.hop_seconds(gb * 1e9, hops[1])
    q.follow_ups.append(Numeric(
        "Only the serving process restarts; the file is still in the page cache, so no drive is read. The loader "
        "copies each tensor to its GPU straight from the memory-mapped (pageable) pages; suppose a test on this node "
        f"shows such copies reaching {fmt(rate)} GB/s per GPU (an assumed figure; PCIe's line rate is "
        f"{fmt(PCIE_GEN5_X16)}). All 8 GPUs copy at once. Seconds for the weights?", "s", warm,
        [f"PCIe alone would give the lower bound {fmt(gb)} / (8 x {fmt(PCIE_GEN5_X16)}) = {fmt(bound)} s",
         "pageable pages go through a pinned staging buffer, with page faults: the copy runs at the measured rate",
         f"{fmt(gb)} / (8 x {fmt(rate)}) = {fmt(warm)} s"],
        "A page-cache hit skips the drives, not the copy: PCIe's line rate bounds it from below, and the rate a "
        "copy from pageable memory reaches sets it.", rtol=0.02,
        mistakes={"takes PCIe's line rate, a lower bound, as the load time": bound,
                  "counts one GPU's copy rate for the whole node": ref.hop_seconds(
                      gb * 1e9, ref.Hop("pageable copy", rate, "GB/s", 1))}))
    return q


@template(STEM, "many replicas pull at once")
def replicas(rng, ref):
    gb = rng.choice([16.0, 70.0, 141.0])
    gbit = rng.choice([100.0, 200.0])
    n = rng.choice([32, 64, 128])
    store = rng.choice([50.0, 100.0, 200.0])
    nic = ref.hop_seconds(gb * 1e9, ref.Hop("NIC", gbit, "Gb/s"))
    shared = ref.hop_seconds(n * gb * 1e9, ref.Hop("store", store, "GB/s"))
    s = max(nic, shared)
    q = Numeric(
        f"A scale-up starts {n} replicas at once, each on its own node with one {fmt(gbit)} Gb/s NIC, and each "
        f"downloads the whole {fmt(gb)} GB checkpoint from one shared object store that serves {fmt(store)} GB/s in "
        "all (an assumed figure). How many seconds until every replica has its weights?", "s", s,
        [f"one NIC alone: {fmt(gb)} / {fmt(gbit / 8)} = {fmt(nic)} s",
         f"the store moves {n} x {fmt(gb)} GB at {fmt(store)} GB/s: {fmt(shared)} s",
         f"the slower of the two sets the time: {fmt(s)} s"],
        "A shared store's bandwidth is divided among everyone reading at once: past a few replicas it, not the NIC, "
        "sets the scale-up time.", rtol=0.02,
        mistakes={"gives each replica the store's whole bandwidth (only the NIC limits it)": nic,
                  "counts the checkpoint once for all replicas": ref.hop_seconds(gb * 1e9, ref.Hop("store", store, "GB/s"))})
    most = store / (gbit / 8)
    q.follow_ups.append(Numeric(
        "How many replicas can download at once before the store, not their NICs, limits each one?", "replicas", most,
        [f"each NIC takes {fmt(gbit)} / 8 = {fmt(gbit / 8)} GB/s", f"{fmt(store)} / {fmt(gbit / 8)} = {fmt(most)}"],
        "Past store bandwidth / NIC bandwidth replicas, each new one slows all the others: stagger them, cache on "
        "local NVMe, or have nodes fetch from each other.", rtol=0.02,
        mistakes={"divides by the NIC's Gb/s without turning bits into bytes": store / gbit}))
    return q


@template(STEM, "design a fast cold start")
def design(rng, ref):
    return Open(
        "A Llama-3-70B replica (141 GB bf16, tp=8 on one node) takes several minutes to come up from an object store. "
        "Walk through where the time goes and how you would get it under a minute, on a 100 Gb/s and on a 400 Gb/s "
        "network.",
        ["break it into hops with bandwidths: network (Gb/s / 8), NVMe, page cache, PCIe per GPU (x8 links); "
         "141 GB at 12.5 GB/s is ~11 s, at 50 GB/s ~3 s",
         "pipeline the hops (chunks, every hop busy): the slowest bounds the load, plus a small fill; serial adds them",
         "parallel ranged reads so the NIC is full; each rank reads only its TP slices (safetensors header -> byte "
         "ranges), so the node moves the checkpoint once",
         "local NVMe cache and page-cache reuse across restarts; a page-cache hit is still bounded below by PCIe "
         "(0.28 s here) and in practice set by the copy from pageable pages (staging buffer, page faults)",
         "pinned host buffers and a copy stream overlap host-to-GPU copies with reads; streaming loaders (Run:ai "
         "Model Streamer, vLLM --load-format runai_streamer), GPUDirect Storage, pre-sharded checkpoints "
         "(sharded_state) so each rank reads one contiguous file",
         "many replicas at once divide the shared store's bandwidth: stagger, cache per node, or fetch from peers",
         "fixed costs beside the weights: image pull, CUDA init, NCCL init, torch.compile, warm-up/profiling, CUDA "
         "graph capture (vLLM: usually under 10 s, up to a minute): overlap, cache compiled artifacts, capture "
         "fewer sizes, or keep a warm standby; measure each phase with a startup report"],
        "Every hop has a bandwidth; the design is making the slowest one the only one you wait for.")
