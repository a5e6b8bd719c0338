import { Global, Module } from '@nestjs/common';
import { RateLimitService } from './rate-limit.service.js';

/** Global so the grab controller (coupon module) can inject RateLimitService without importing this module. */
@Global()
@Module({ providers: [RateLimitService], exports: [RateLimitService] })
export class RateLimitModule {}
