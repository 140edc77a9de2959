-- Wireshark dissector for nslab probes, version 1 (agents/PROBE.md; agents/probe.py holds the
-- same layout as code and as the scapy layer NslabProbe).
--
--   wireshark -X lua_script:tools/wireshark/nslab_probe.lua capture.pcap
--   tshark -X lua_script:tools/wireshark/nslab_probe.lua -r capture.pcap -Y nslab
--   (or copy it into ~/.local/lib/wireshark/plugins/)
--
-- Probes are UDP datagrams to port 7701 (the agents' default --port); on other ports the
-- heuristic takes a datagram of at least 56 bytes starting with magic 0x4E53 and version 1.
-- All integers are big-endian. Written for Lua 5.2 and later (no bitwise operators).

local MAGIC, VERSION, HEADER_LEN, TAG_LEN, PORT = 0x4E53, 1, 56, 16, 7701

local nslab = Proto("nslab", "nslab probe")

local f = {
    magic      = ProtoField.uint16("nslab.magic", "Magic", base.HEX),
    version    = ProtoField.uint8("nslab.version", "Version", base.DEC),
    flags      = ProtoField.uint8("nslab.flags", "Flags", base.HEX),
    auth       = ProtoField.bool("nslab.flags.auth", "AUTH: tag present", 8, nil, 0x01),
    followup   = ProtoField.bool("nslab.flags.followup", "FOLLOWUP: fu_* valid", 8, nil, 0x02),
    fu_user    = ProtoField.bool("nslab.flags.fu_user", "FU_USER: fu_* are user-space stamps",
                                 8, nil, 0x04),
    src        = ProtoField.uint32("nslab.src", "Sender id", base.HEX),
    dst        = ProtoField.uint32("nslab.dst", "Receiver id", base.HEX),
    seq        = ProtoField.uint64("nslab.seq", "Sequence", base.DEC),
    pair_id    = ProtoField.uint32("nslab.pair_id", "Pair id", base.DEC),
    idx        = ProtoField.uint8("nslab.idx", "Index in pair", base.DEC),
    reserved   = ProtoField.uint24("nslab.reserved", "Reserved", base.HEX),
    tx_ns      = ProtoField.int64("nslab.tx_ns", "TX, sender's VM clock (ns)", base.DEC),
    fu_pair_id = ProtoField.uint32("nslab.fu_pair_id", "Follow-up pair id", base.DEC),
    fu_tx0_ns  = ProtoField.int64("nslab.fu_tx0_ns", "Follow-up TX of probe 0 (ns)", base.DEC),
    fu_tx1_ns  = ProtoField.int64("nslab.fu_tx1_ns", "Follow-up TX of probe 1 (ns)", base.DEC),
    padding    = ProtoField.bytes("nslab.padding", "Padding"),
    tag        = ProtoField.bytes("nslab.tag", "HMAC-SHA256 tag (first 16 bytes)"),
}
nslab.fields = { f.magic, f.version, f.flags, f.auth, f.followup, f.fu_user, f.src, f.dst,
                 f.seq, f.pair_id, f.idx, f.reserved, f.tx_ns, f.fu_pair_id, f.fu_tx0_ns,
                 f.fu_tx1_ns, f.padding, f.tag }

local bad_version = ProtoExpert.new("nslab.version.unknown", "Probe version is not 1",
                                    expert.group.PROTOCOL, expert.severity.WARN)
local bad_idx = ProtoExpert.new("nslab.idx.bad", "idx is not 0 or 1 (rejected as bad_field)",
                                expert.group.MALFORMED, expert.severity.WARN)
nslab.experts = { bad_version, bad_idx }

local function bit_set(value, bit)
    return math.floor(value / 2 ^ bit) % 2 == 1
end

function nslab.dissector(tvb, pinfo, tree)
    local len = tvb:len()
    if len < HEADER_LEN or tvb(0, 2):uint() ~= MAGIC then
        return 0
    end
    pinfo.cols.protocol = "NSLAB"
    local t = tree:add(nslab, tvb(), "nslab probe")
    t:add(f.magic, tvb(0, 2))
    local v = t:add(f.version, tvb(2, 1))
    if tvb(2, 1):uint() ~= VERSION then
        v:add_proto_expert_info(bad_version)
    end
    local flags = tvb(3, 1):uint()
    local ft = t:add(f.flags, tvb(3, 1))
    ft:add(f.auth, tvb(3, 1))
    ft:add(f.followup, tvb(3, 1))
    ft:add(f.fu_user, tvb(3, 1))
    t:add(f.src, tvb(4, 4))
    t:add(f.dst, tvb(8, 4))
    t:add(f.seq, tvb(12, 8))
    t:add(f.pair_id, tvb(20, 4))
    local it = t:add(f.idx, tvb(24, 1))
    if tvb(24, 1):uint() > 1 then
        it:add_proto_expert_info(bad_idx)
    end
    t:add(f.reserved, tvb(25, 3))
    t:add(f.tx_ns, tvb(28, 8))
    t:add(f.fu_pair_id, tvb(36, 4))
    t:add(f.fu_tx0_ns, tvb(40, 8))
    t:add(f.fu_tx1_ns, tvb(48, 8))
    local tag_len = (bit_set(flags, 0) and len >= HEADER_LEN + TAG_LEN) and TAG_LEN or 0
    if len - tag_len > HEADER_LEN then
        t:add(f.padding, tvb(HEADER_LEN, len - tag_len - HEADER_LEN))
    end
    if tag_len > 0 then
        t:add(f.tag, tvb(len - TAG_LEN, TAG_LEN))
    end
    pinfo.cols.info = string.format("probe %08x -> %08x seq=%s pair=%d idx=%d%s%s",
        tvb(4, 4):uint(), tvb(8, 4):uint(), tostring(tvb(12, 8):uint64()), tvb(20, 4):uint(),
        tvb(24, 1):uint(), bit_set(flags, 1) and " followup" or "",
        tag_len > 0 and " auth" or "")
    return len
end

local function heuristic(tvb, pinfo, tree)
    if tvb:len() < HEADER_LEN or tvb(0, 2):uint() ~= MAGIC or tvb(2, 1):uint() ~= VERSION then
        return false
    end
    nslab.dissector(tvb, pinfo, tree)
    return true
end

DissectorTable.get("udp.port"):add(PORT, nslab)
nslab:register_heuristic("udp", heuristic)
