-- Sensor readings as documents in MongoDB (the mongo sink, disabled in etc/rtd.conf).
-- Payloads like {"temp": 21.5, "hum": 40, "tags": ["roof"]} become nested documents;
-- a reading that is not JSON is skipped rather than counted as a failure.
return {
    name = "mongo_sensors",
    from = "sensors/+/data",
    sample = { topic = "sensors/s1/data", payload = '{"temp": 21.5, "tags": ["roof"]}' },
    select = function(msg)
        local ok, reading = pcall(json.decode, msg.payload)
        if not ok or type(reading) ~= "table" then
            return nil
        end
        return {
            sensor = topic.split(msg.topic)[2],
            at = time.format(msg.timestamp),
            client = msg.clientid,
            reading = reading,
            site = msg.props.site,     -- an MQTT 5 user property, if the client sent one
        }
    end,
    to = { mongo = { collection = "sensors" } },
    enabled = false,
}
