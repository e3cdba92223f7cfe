-- Reshape: JSON temperature readings above 20 degrees, one row each.
return {
    name = "temps",
    from = "sensors/+/temp",
    sample = { topic = "sensors/s1/temp", payload = '{"t": 25}' },
    select = function(msg, ctx)
        local d = json.decode(msg.payload)
        if d.t <= 20 then
            return nil
        end
        return { sensor = topic.split(msg.topic)[2], t = d.t, client = msg.clientid }
    end,
    to = { store = { table = "temps" } },
}
