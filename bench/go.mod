module github.com/oncekit/oncekit/bench

go 1.26.8

require github.com/oncekit/oncekit v0.0.0

require (
	github.com/ThreeDotsLabs/watermill v1.5.1 // indirect
	github.com/ThreeDotsLabs/watermill-nats/v2 v2.1.3 // indirect
	github.com/ThreeDotsLabs/watermill-sql/v3 v3.1.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
)

replace github.com/oncekit/oncekit => ../
