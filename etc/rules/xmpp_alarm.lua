-- MQTT to XMPP: a hot reading becomes a line in a group chat room (the xmpp sink "alerts",
-- disabled in etc/rtd.conf, to alerts@conference.example.org, from its nick "alarm"). Turn
-- both on with an xmpp table whose muc_host serves the room (docs/XMPP.md, "Rules across
-- MQTT and XMPP"). A reading that is not JSON with a number in temp is no alarm.
local HOT = 30

local function temperature(payload)
    local ok, reading = pcall(json.decode, payload)
    return ok and type(reading) == "table" and tonumber(reading.temp) or nil
end

return {
    name = "xmpp_alarm",
    from = "sensors/+/temp",
    sample = { topic = "sensors/s1/temp", payload = '{"temp": 31.5}' },
    select = function(msg)
        local t = temperature(msg.payload)
        if t and t > HOT then
            return { sensor = topic.split(msg.topic)[2], temp = t, at = time.format(msg.timestamp) }
        end
    end,
    to = { "alerts" },
    enabled = false,
}
