-- Every broker event, with the fields that fit each one.
return {
    name = "events",
    from = { "client.connected", "client.disconnected", "session.subscribed",
             "session.unsubscribed", "message.delivered", "message.acked", "message.dropped" },
    select = function(e)
        assert(e.clientid == "c1" and e.peer == "1.2.3.4:5" and e.timestamp == 42, "origin")
        local k = e.event
        if k == "client.connected" then
            assert(e.proto_ver == 5 and e.keepalive == 30 and e.clean_start == true, k)
        elseif k == "client.disconnected" then
            assert(e.reason_code == 142 and e.reason == "takeover", k)
        elseif k == "session.subscribed" then
            assert(e.topic == "s/#" and e.qos == 1, k)
        elseif k == "session.unsubscribed" then
            assert(e.topic == "s/#" and e.qos == nil, k)
        else
            assert(e.topic == "m/1" and e.payload == "hello" and e.qos == 1, k)
            assert(e.from_clientid == "pub" and e.props.k == "v", k)
            assert(k ~= "message.dropped" or e.reason == "queue_full", k)
        end
        return { event = k, clientid = e.clientid }
    end,
    to = {},
}
