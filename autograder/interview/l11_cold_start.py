"""Lesson 11 questions: seconds per hop, serial vs pipelined loads, bytes per rank, restarts, the design."""
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
        f"{fmt(gb)} GB of weights sit in host RAM and are split evenly over {gpus} GPUs, each on its own PCIe Gen5 x16 "
        f"link (~{fmt(PCIE_GEN5_X16)} GB/s per direction). How long do the host-to-GPU copies take, all GPUs at once?",
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
    warm = ref.hop_seconds(gb * 1e9, hops[1])
    q.follow_ups.append(Numeric(
        "Only the serving process restarts; the file is still in the page cache. Seconds for the weights now?", "s",
        warm, [f"PCIe only: {fmt(gb)} / (8 x {fmt(PCIE_GEN5_X16)}) = {fmt(warm)} s"],
        "A memory-mapped load reads page-cache pages in place: the restart pays only PCIe.", rtol=0.02))
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
         "local NVMe cache and page-cache reuse across restarts; memory-mapped safetensors avoids extra copies",
         "pinned host buffers and a copy stream overlap host-to-GPU copies with reads",
         "fixed costs: CUDA init, warm-up/profiling, CUDA graph capture (seconds to a minute): overlap, capture "
         "fewer sizes, or keep a warm standby; measure each phase with a startup report"],
        "Every hop has a bandwidth; the design is making the slowest one the only one you wait for.")
