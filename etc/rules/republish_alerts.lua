-- Hot readings republished as JSON alerts on alerts/<sensor> (the republish sink,
-- disabled in etc/rtd.conf). Without a payload template the republished payload is
-- the row as JSON: {"sensor":"s1","temp":31.5,"at":"2026-...Z","from":"c1"}.
local LIMIT = 30

return {
    name = "republish_alerts",
    from = "sensors/+/temp",
    sample = { topic = "sensors/s1/temp", payload = '{"temp": 31.5}' },
    select = function(msg)
        local ok, d = pcall(json.decode, msg.payload)
        if not ok or type(d) ~= "table" or type(d.temp) ~= "number" or d.temp <= LIMIT then
            return nil
        end
        return {
            sensor = topic.split(msg.topic)[2],
            temp = d.temp,
            at = time.format(msg.timestamp),
            from = msg.clientid,
        }
    end,
    to = { republish = { topic = "alerts/${sensor}", qos = 1 } },
    enabled = false,
}
