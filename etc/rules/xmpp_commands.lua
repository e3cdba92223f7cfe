-- XMPP to MQTT: "/set lamp on" said in a chat (to a room or to anyone) publishes "on" to
-- home/lamp/set, a device's command topic (the republish sink, disabled in etc/rtd.conf).
-- Only the words of the command are taken: a device name and a value of letters, digits,
-- - and _, so nothing a chat says can reach a topic level it should not (no / + # in them).
return {
    name = "xmpp_commands",
    from = "xmpp.message",
    sample = { event = "xmpp.message", from = "juliet@example.org/phone",
               to = "home@conference.example.org", type = "groupchat", payload = "/set lamp on" },
    select = function(msg)
        local device, value = (msg.payload or ""):match("^/set ([%w_-]+) ([%w_-]+)$")
        if not device then
            return nil
        end
        return { device = device, value = value, by = msg.username }
    end,
    to = { republish = { topic = "home/${device}/set", payload = "${value}", qos = 1 } },
    enabled = false,
}
