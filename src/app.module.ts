import { DynamicModule, Module, Type } from '@nestjs/common';
import { ScheduleModule } from '@nestjs/schedule';
import { AuthModule } from './auth/auth.module.js';
import { AppConfig } from './config/app-config.js';
import { ConfigModule } from './config/config.module.js';
import { CouponModule } from './coupon/coupon.module.js';
import { DatabaseModule } from './database/database.module.js';
import { HealthModule } from './health/health.module.js';
import { Stopping } from './common/stopping.js';
import { IssuanceModule } from './issuance/issuance.module.js';
import { LedgerModule } from './ledger/ledger.module.js';
import { RateLimitModule } from './rate-limit/rate-limit.module.js';
import { ReconciliationModule } from './reconciliation/reconciliation.module.js';
import { RedemptionModule } from './redemption/redemption.module.js';
import { StateMachineModule } from './state-machine/state-machine.module.js';
import { WebhooksModule } from './webhooks/webhooks.module.js';

@Module({})
export class AppModule {
  /**
   * `extra` lets a harness (the benchmark's reference designs) mount modules on the very same stack;
   * `stopping` is the app's, made before the modules because the adapter's hooks read it too.
   */
  static forRoot(config: AppConfig, extra: (Type | DynamicModule)[] = [], stopping = new Stopping()): DynamicModule {
    return {
      module: AppModule,
      global: true,
      providers: [{ provide: Stopping, useValue: stopping }],
      exports: [Stopping],
      imports: [
        ConfigModule.forRoot(config),
        DatabaseModule,
        ScheduleModule.forRoot({ cronJobs: config.SCHEDULER_ENABLED, intervals: false, timeouts: false }),
        AuthModule,
        HealthModule,
        RateLimitModule,
        LedgerModule,
        StateMachineModule,
        CouponModule,
        RedemptionModule,
        ReconciliationModule,
        WebhooksModule,
        IssuanceModule,
        ...extra,
      ],
    };
  }
}
