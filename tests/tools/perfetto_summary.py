"""Read a Perfetto protobuf trace with Perfetto's own generated protos (PyPI package
`perfetto`, module perfetto_trace_pb2) and print what it holds as JSON, for the tests:
tracks, slices per thread rebuilt from begin/end events (name, depth, start, end),
instants per category, counter values, interned source locations.

Usage: python3 perfetto_summary.py TRACE
"""
import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

SEQ_INCREMENTAL_STATE_CLEARED = 1


def main(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    names, cats, locs = {}, {}, {}
    tracks, counters = {}, {}
    stacks, slices, instants = {}, {}, {}

    cleared_first = None
    for p in trace.packet:
        if p.HasField("sequence_flags") and cleared_first is None:
            cleared_first = bool(p.sequence_flags & SEQ_INCREMENTAL_STATE_CLEARED)
        if p.HasField("interned_data"):
            for n in p.interned_data.event_names:
                names[n.iid] = n.name
            for c in p.interned_data.event_categories:
                cats[c.iid] = c.name
            for l in p.interned_data.source_locations:
                locs[l.iid] = {"file": l.file_name, "function": l.function_name,
                               "line": l.line_number}
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            t = {"uuid": d.uuid, "parent": d.parent_uuid, "name": d.name}
            if d.HasField("thread"):
                t.update(pid=d.thread.pid, tid=d.thread.tid, thread_name=d.thread.thread_name)
            if d.HasField("process"):
                t.update(pid=d.process.pid, process_name=d.process.process_name)
            if d.HasField("counter"):
                t["counter"] = True
            tracks[d.uuid] = t
        if p.HasField("track_event"):
            e = p.track_event
            ts = p.timestamp
            key = str(e.track_uuid)
            if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
                stacks.setdefault(key, []).append((names[e.name_iid], ts, e.source_location_iid))
            elif e.type == pb.TrackEvent.TYPE_SLICE_END:
                st = stacks.get(key) or []
                if not st:
                    raise SystemExit("slice end without a begin on track %s" % key)
                name, start, loc = st.pop()
                if ts < start:
                    raise SystemExit("slice %s ends before it begins" % name)
                slices.setdefault(key, []).append(
                    {"name": name, "depth": len(st), "start": start, "end": ts,
                     "location": locs.get(loc)})
            elif e.type == pb.TrackEvent.TYPE_INSTANT:
                cat = cats[e.category_iids[0]]
                per = instants.setdefault(key, {})
                per[cat] = per.get(cat, 0) + 1
            elif e.type == pb.TrackEvent.TYPE_COUNTER:
                counters.setdefault(tracks[e.track_uuid]["name"], []).append(e.counter_value)
    json.dump({
        "packets": len(trace.packet),
        "first_sequence_cleared": cleared_first,
        "tracks": list(tracks.values()),
        "slices": slices,
        "open": {k: len(v) for k, v in stacks.items() if v},
        "instants": instants,
        "counters": counters,
        "locations": list(locs.values()),
    }, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
