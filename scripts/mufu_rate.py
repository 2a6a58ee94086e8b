#!/usr/bin/env python3
"""How fast warps issue ex2 (MUFU.EX2) on this GPU: cycles per warp instruction on one SM sub-partition (SMSP) with
1 to 4 warps on each, 16 independent exponentials a thread in flight (clock64 around 4096 rounds, one CTA an SM).

The softmax's exponentials are the long pole of the Hopper forward (BENCHMARKS.md's visit timeline): a consumer
warp's 64 ex2 a visit run at the rate this prints for as many warps as issue them side by side.
Usage: python3 scripts/mufu_rate.py
"""
import cupy as cp

SOURCE = r'''
extern "C" __global__ void ex2_rate(float* out, long long* cycles, int rounds) {
    float a[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) a[j] = -1e-3f * (threadIdx.x + j);
    __syncthreads();
    const long long t0 = clock64();
    for (int i = 0; i < rounds; ++i)
#pragma unroll
        for (int j = 0; j < 16; ++j) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(a[j]));
    const long long t1 = clock64();
    __syncthreads();
    float r = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) r += a[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = r;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
'''
SMSPS, CHAINS, ROUNDS = 4, 16, 4096

cc = cp.cuda.Device().compute_capability
kernel = cp.RawKernel(SOURCE, "ex2_rate", options=(f"-arch=sm_{cc}",))
sms = cp.cuda.Device().attributes["MultiProcessorCount"]
print(f"sm_{cc}, {sms} SMs")
for warps in (1, 2, 3, 4):   # warps on each SMSP
    threads = SMSPS * 32 * warps
    out, cycles = cp.zeros(sms * threads, cp.float32), cp.zeros(sms, cp.int64)
    for _ in range(2):   # the second launch is timed (the first loads the module)
        kernel((sms,), (threads,), (out, cycles, cp.int32(ROUNDS)))
    cp.cuda.runtime.deviceSynchronize()
    per = float(cp.median(cycles)) / (ROUNDS * CHAINS * warps)
    print(f"{warps} warp(s) a SMSP: {per:5.2f} cycles per ex2 warp instruction on the SMSP "
          f"({SMSPS * 32 / per:5.1f} ex2 a cycle an SM)")
