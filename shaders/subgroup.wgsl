// Entry-point inputs of the kernels with a subgroup fast path, and the
// helpers of that path.

#if SUBGROUPS
struct Invocation {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
}

var<workgroup> subgroups_seen: atomic<u32>;

// This subgroup's number in its workgroup, in the order subgroups get here:
// nothing assumes how a device maps invocations to subgroups (WebGPU leaves
// that open). Call once per invocation, in uniform control flow.
fn subgroup_slot(sg_lane: u32) -> u32 {
    var first = 0u;
    if sg_lane == 0u {
        first = atomicAdd(&subgroups_seen, 1u);
    }
    return subgroupBroadcast(first, 0u);
}
#else
struct Invocation {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
}
#endif
