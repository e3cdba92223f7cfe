-- Every message, as it came, into the archive sink (SQLite: see `sinks` in etc/rtd.conf,
-- table "messages", made from the first row's keys). A rule file returns one table;
-- rules/rule_engine.h documents every field, the msg table and the sandbox.
return {
    name = "archive",
    description = "every message into the archive sink",
    from = "#",                        -- '#' does not match $SYS/... topics (MQTT's rule)
    select = function(msg)
        -- One row: a table of column = value. Payload bytes that are not UTF-8 (or hold
        -- a NUL) are stored as a BLOB, the others as TEXT.
        return {
            ts = msg.timestamp,        -- ms since the epoch, when the broker took it
            topic = msg.topic,
            clientid = msg.clientid,
            qos = msg.qos,
            retain = msg.retain,
            payload = msg.payload,
        }
    end,
    to = { "archive" },
    enabled = true,
    durable = false,                   -- true: the publisher's PUBACK waits for the commit
}
