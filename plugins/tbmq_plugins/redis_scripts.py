"""The Lua scripts of the Redis device store
(:mod:`tbmq_plugins.redis_store`), after TBMQ's ``DeviceMsgServiceImpl``.

The layout, per client id ``C`` under the key prefix ``P``:

``P{C}_messages``
    a sorted set with one member per stored delivery: the member is its
    ``seq`` written with 19 digits (so that members of equal score sort in
    ``seq`` order), the score its ``seq`` (a double: exact up to 2**53,
    and never out of order above).
``P{C}_messages_<member>``
    a hash per delivery: ``d`` the ``dlv`` record
    (:func:`tbmq.backends.deliveries.encode_delivery`), ``p`` the packet
    id (``""`` for none), ``s`` the :class:`~tbmq.model.DeliveryState`.

The ``{C}`` hash tag puts every key of a client in one Redis Cluster slot,
as TBMQ's keys are, so the scripts may touch the message keys they derive
from ``KEYS[1]``.  With a TTL every key written by an add gets it (the
message keys their own, the sorted set that of the latest add), as TBMQ
gives each message key its TTL; a member whose message key expired is
dropped by the next load or count that meets it, as TBMQ's load does.

Every script is atomic; :data:`ADD` writes, trims and sets the TTL in one
step, as TBMQ's ``ADD_MESSAGES_SCRIPT``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ["ADD", "CLEAR", "COUNT", "LOAD", "REMOVE", "SCRIPTS", "UPDATE", "WRITE_BATCH", "Script"]


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA-1 (the name ``EVALSHA`` knows it by).

    :ivar name: a name for log messages.
    :ivar source: the script, bytes.
    :ivar sha: the hex SHA-1 of ``source``.
    """

    name: str
    source: bytes
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source).hexdigest())


# The writes, shared by ADD, UPDATE, REMOVE and WRITE_BATCH.  add writes
# ``items`` into ``queue`` and returns how many of the trimmed members
# still had their message.
_WRITES = b"""
local function add(queue, limit, ttl, items)
    for i = 1, #items, 5 do
        local key = queue .. '_' .. items[i]
        redis.call('HSET', key, 'd', items[i + 2], 'p', items[i + 3], 's', items[i + 4])
        if ttl > 0 then redis.call('EXPIRE', key, ttl) else redis.call('PERSIST', key) end
        redis.call('ZADD', queue, items[i + 1], items[i])
    end
    if ttl > 0 then redis.call('EXPIRE', queue, ttl) else redis.call('PERSIST', queue) end
    local removed = 0
    if limit > 0 then
        local excess = redis.call('ZCARD', queue) - limit
        if excess > 0 then
            for _, member in ipairs(redis.call('ZRANGE', queue, 0, excess - 1)) do
                removed = removed + redis.call('DEL', queue .. '_' .. member)
            end
            redis.call('ZREMRANGEBYRANK', queue, 0, excess - 1)
        end
    end
    return removed
end

local function update(queue, member, packet_id, state)
    local key = queue .. '_' .. member
    if redis.call('EXISTS', key) == 1 then
        redis.call('HSET', key, 'p', packet_id, 's', state)
    end
end

local function remove(queue, members)
    for _, member in ipairs(members) do
        redis.call('DEL', queue .. '_' .. member)
        redis.call('ZREM', queue, member)
    end
end
"""

# The read, shared by LOAD and WRITE_BATCH: a page of ``queue`` after
# ``after`` (see LOAD), as one msgpack array.
_LOAD = b"""
local function load(queue, low, after, want)
    local out = {}
    while want ~= 0 do
        local n = 1000
        if want > 0 and want < n then n = want end
        local ties = 0
        if after ~= '' then ties = redis.call('ZCOUNT', queue, low, low) end
        local page = redis.call('ZRANGEBYSCORE', queue, low, '+inf', 'WITHSCORES',
                                'LIMIT', 0, n + ties)
        for i = 1, #page, 2 do
            local member = page[i]
            if want ~= 0 and (after == '' or member > after) then
                local v = redis.call('HMGET', queue .. '_' .. member, 'd', 'p', 's')
                if v[1] then
                    out[#out + 1] = member
                    out[#out + 1] = v[2]
                    out[#out + 1] = v[3]
                    out[#out + 1] = v[1]
                    if want > 0 then want = want - 1 end
                else
                    redis.call('ZREM', queue, member)
                end
                after, low = member, page[i + 1]
            end
        end
        if #page < 2 * (n + ties) then break end  -- WITHSCORES: two items a member
    end
    return cmsgpack.pack(out)
end
"""

#: KEYS[1] the sorted set; ARGV[1] the per-client limit (0: none), ARGV[2]
#: the TTL in seconds (0: none), ARGV[3] one msgpack array of five strings
#: per delivery: member, score, record, packet id, state (msgpack's str type
#: throughout: Redis's cmsgpack reads no bin; one argument instead of five
#: per delivery keeps the client's encoding work small).  Writes them (a
#: member already there is replaced), trims the lowest members beyond the
#: limit and returns how many of them still had their message.
ADD = Script("add", _WRITES + b"""
return add(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), cmsgpack.unpack(ARGV[3]))
""")

#: KEYS the sorted sets of several writes (a client's may come more than
#: once), ARGV[1] and ARGV[2] as for :data:`ADD`, ARGV[3] one msgpack array
#: holding, per key, a write: ``["a", items]`` an add (``items`` as
#: :data:`ADD`'s ARGV[3]), ``["u", member, packet id, state]`` an update as
#: :data:`UPDATE`, ``["r", members]`` a removal as :data:`REMOVE`, ``["l",
#: low, after, want]`` a read as :data:`LOAD` (its ARGV).  Runs them in KEYS
#: order (so each client's calls stay in call order: a read sees the writes
#: called before it, not those called after) and returns the array of their
#: results (an add's trim count, a read's msgpack array, 0 otherwise).
#: One call for the writes and reads a connection got in one reactor turn
#: (a burst of resumed sessions reads its stores in one call): Redis then
#: runs one script instead of one per call.  Its keys are those of many
#: clients: it suits one Redis server, not a Redis Cluster (CROSSSLOT).
WRITE_BATCH = Script("write_batch", _WRITES + _LOAD + b"""
local limit, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local writes = cmsgpack.unpack(ARGV[3])
local out = {}
for k = 1, #KEYS do
    local queue, write = KEYS[k], writes[k]
    out[k] = 0
    if write[1] == 'a' then
        out[k] = add(queue, limit, ttl, write[2])
    elseif write[1] == 'u' then
        update(queue, write[2], write[3], write[4])
    elseif write[1] == 'l' then
        out[k] = load(queue, write[2], write[3], tonumber(write[4]))
    else
        remove(queue, write[2])
    end
end
return out
""")

#: KEYS[1] the sorted set; ARGV member, packet id, state.  Changes a stored
#: delivery's packet id and state (its TTL stays); ignores an unknown one.
UPDATE = Script("update", _WRITES + b"""
update(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
return 0
""")

#: KEYS[1] the sorted set; ARGV the members to remove.
REMOVE = Script("remove", _WRITES + b"""
remove(KEYS[1], ARGV)
return 0
""")

#: KEYS[1] the sorted set.  Removes every delivery of the client.
CLEAR = Script("clear", b"""
local queue = KEYS[1]
for _, member in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
    redis.call('DEL', queue .. '_' .. member)
end
redis.call('DEL', queue)
return 0
""")

#: KEYS[1] the sorted set.  Returns the number of deliveries whose message
#: is there, dropping the members of expired ones.
COUNT = Script("count", b"""
local queue = KEYS[1]
local n = 0
for _, member in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
    if redis.call('EXISTS', queue .. '_' .. member) == 1 then
        n = n + 1
    else
        redis.call('ZREM', queue, member)
    end
end
return n
""")

#: KEYS[1] the sorted set; ARGV[1] the score to start from ('-inf', or the
#: score of ARGV[2]), ARGV[2] the member to load after ('' for none),
#: ARGV[3] the most to return (-1: all).  Returns one msgpack array,
#: [member, packet id, state, record, ...] in seq order (a single reply:
#: one bulk string instead of four per delivery), dropping the members of
#: expired messages on the way (as TBMQ's GET_MESSAGES_SCRIPT) and reading
#: on past them, so that a page is short only at the end of the queue.
LOAD = Script("load", _LOAD + b"""
return load(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]))
""")

#: Every script, loaded on each connection before it is used.
SCRIPTS = (ADD, WRITE_BATCH, UPDATE, REMOVE, CLEAR, COUNT, LOAD)
